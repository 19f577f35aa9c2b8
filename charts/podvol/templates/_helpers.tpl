{{/*
The labels every object carries: the app.kubernetes.io set. The selectors
of the DaemonSet and the Deployment use only name and component (selector
labels never change, so that an upgrade, or an install over deploy/base,
keeps the same pods' owner).
*/}}
{{- define "podvol.labels" -}}
app.kubernetes.io/name: podvol
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: podvol
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* The selector labels of a component. */}}
{{- define "podvol.selector" -}}
app.kubernetes.io/name: podvol
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
An image reference: [registry/]repository, then @digest if set, else
:tag (podvol's own images default to the chart's appVersion). .image is
one entry of .Values.images; an empty registry falls back to
images.registry.
*/}}
{{- define "podvol.image" -}}
{{- $registry := .image.registry | default .root.Values.images.registry -}}
{{- $ref := .image.repository -}}
{{- if $registry }}{{ $ref = printf "%s/%s" (trimSuffix "/" $registry) $ref }}{{ end -}}
{{- if .image.digest -}}
{{ $ref }}@{{ .image.digest }}
{{- else -}}
{{ $ref }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* A container's image and pull policy. */}}
{{- define "podvol.container" -}}
image: {{ include "podvol.image" . | quote }}
imagePullPolicy: {{ .root.Values.images.pullPolicy }}
{{- end }}
