package datapath

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DirectIOFlag is the plugin's flag that chooses between buffered loop
// devices and direct I/O (issue 22).
const DirectIOFlag = "direct-io"

// HasFlag reports whether a Go program's -h output (the flag package's
// usage) lists the flag name.
func HasFlag(usage, name string) bool {
	return regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(name) + `(\s|=|$)`).MatchString(usage)
}

// DefaultVariants are "before" and "after" for a plugin whose -h output is
// usage: buffered loop devices, as podvol had them, and direct I/O. A plugin
// without the flag runs as it is in both, and the report says so.
func DefaultVariants(usage string) []Variant {
	if HasFlag(usage, DirectIOFlag) {
		return []Variant{
			{Name: "before", Args: []string{"--" + DirectIOFlag + "=false"}},
			{Name: "after", Args: []string{"--" + DirectIOFlag + "=true"}},
		}
	}
	note := "this plugin has no --" + DirectIOFlag + " flag: it runs as it is"
	return []Variant{
		{Name: "before", Note: note},
		{Name: "after", Note: note + ", so after = before"},
	}
}

var variantName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// ParseVariant reads -variant's "name=--flag=value --other" into a
// variant with those plugin arguments (split at spaces).
func ParseVariant(s string) (Variant, error) {
	name, args, ok := strings.Cut(s, "=")
	if !ok || !variantName.MatchString(name) {
		return Variant{}, fmt.Errorf("variant %q: want name=plugin-arguments, the name in lower case letters, digits and dashes (e.g. discard=--direct-io=true --discard=mount)", s)
	}
	return Variant{Name: name, Args: strings.Fields(args)}, nil
}

// AddVariants appends extra to variants, refusing a name twice.
func AddVariants(variants []Variant, extra []string) ([]Variant, error) {
	for _, e := range extra {
		v, err := ParseVariant(e)
		if err != nil {
			return nil, err
		}
		for _, have := range variants {
			if have.Name == v.Name {
				return nil, fmt.Errorf("variant %q is there twice", v.Name)
			}
		}
		variants = append(variants, v)
	}
	return variants, nil
}

// ParseSize reads a size as fio and dd write it: a number with an optional
// k, m, g or t (binary multiples, any case, an optional "iB" or "B").
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "b"), "i")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a positive number with an optional k, m, g or t (e.g. 1g, 512m)", s)
	}
	return n * mult, nil
}

// ParseFilesystems reads -fs: a comma-separated subset of xfs, ext4 and
// block, in the order given.
func ParseFilesystems(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "xfs", "ext4", "block":
		default:
			return nil, fmt.Errorf("filesystem %q: want xfs, ext4 or block", f)
		}
		for _, have := range out {
			if have == f {
				return nil, fmt.Errorf("filesystem %q is there twice", f)
			}
		}
		out = append(out, f)
	}
	return out, nil
}
