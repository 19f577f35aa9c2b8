// Package transfer moves a volume's data between the plugins of two nodes.
// The target node pulls; the source node serves an image that does not
// change while it is served (a snapshot, or a snapshot cut for the move).
//
// Both ends authenticate each other with mutual TLS, with certificates whose
// subject names a node (CommonName); what a node may pull is the
// Authorizer's to say, asked for every request with the caller's node as the
// certificate proves it. Only the image's data extents move (SEEK_DATA,
// SEEK_HOLE; chunks of zeros are sent as their length alone), every chunk
// carries its CRC-32C, taken as the source's read returns it and checked
// before the target writes it, and the stream ends with a SHA-256 over
// every frame's header, checksums included (TLS already protects the
// stream in transit; the digest catches a frame lost or reordered by a bug
// on either side, the checksums a chunk altered between the source's read
// and the target's check: wire.go says exactly what they cover). Both ends
// work in two goroutines each, the disk on one and the network and
// checksums on the other, a few chunks apart. The target syncs its copy
// every SyncEvery bytes (its writes started to the disk as they are made)
// and records how far it is verified (a Checkpoint); a pull that stops, on
// either side, resumes from there as long as the source serves the same
// image (its Identity). A resumed stream still starts at offset 0: what
// comes before the checkpoint is sent as checks (each chunk's CRC-32C, and
// zeros), which the target compares with what its copy holds, read back;
// so the digest at its end covers the whole image (or the whole of a
// pull's changes), whatever the resumes, and a copy damaged since an
// earlier attempt wrote it is found and pulled again from the damage.
//
// A copy that holds an image whole asks Since it for only what changed: the
// source sends the extents of its new image whose blocks are not the old
// one's (reflink snapshots of one volume share what was not written between
// them; FIEMAP tells) and, as zeros the target punches out, what the old one
// held and the new one does not. A source still in use serves what it has
// and says More; the volume's last changes follow once it is not (a
// migration: the pre-copy while the pod runs, then the rest).
//
// The protocol is HTTP/1.1 over TLS 1.3, one GET per pull, the body a
// stream of frames (wire.go): no code generation, no HTTP/2 flow-control
// window between the disk and the network.
package transfer

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// CommonNamePrefix starts the subject common name of a node's transfer
// certificate; the node's name follows.
const CommonNamePrefix = "system:podvol-transfer:"

// CommonName is the subject common name of node's certificate.
func CommonName(node string) string { return CommonNamePrefix + node }

// NodeOf returns the node a verified certificate names.
func NodeOf(cert *x509.Certificate) (string, error) {
	node, ok := strings.CutPrefix(cert.Subject.CommonName, CommonNamePrefix)
	if !ok || !nodeName.MatchString(node) {
		return "", fmt.Errorf("certificate subject %q does not name a node (want %s<node>)", cert.Subject.CommonName, CommonNamePrefix)
	}
	return node, nil
}

// nodeName is a Kubernetes object name (a DNS subdomain).
var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// sourceName bounds what a request may name as its source: the ids the
// pool makes, and nothing that could be read as a path.
var sourceName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,127}$`)

// Claim is the PersistentVolumeClaim a pull is for.
type Claim struct {
	Namespace, Name, UID string
}

func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// Request is one pull as the source sees it.
type Request struct {
	// Caller is the node that asks, from its verified certificate.
	Caller string
	// Source is the image's id on the source node.
	Source string
	// Claim is the claim the caller copies for.
	Claim Claim
	// From is the offset to serve from (a resumed pull).
	From int64
	// Since is the identity of an image the caller holds whole (an earlier
	// pull of the same source): only what differs from it is asked for.
	Since string
	// Version is the transfer protocol the caller announced (0: none, a
	// plugin older than versions).
	Version int
	// Move is set by the Authorizer for a pull that moves a volume in use
	// (a migration): the source serves what it has while the volume is in
	// use (Image.More) and the rest once it is not.
	Move bool
}

// Image is an image opened for serving. The server closes File.
type Image struct {
	File *os.File
	// Size is the image's size in bytes.
	Size int64
	// Identity changes whenever a different image is served under the same
	// source id: a resumed pull whose checkpoint names another identity
	// starts again.
	Identity string
	// Base, if not nil, is the image the request's Since names, still
	// held by the source: only the extents of File that are not Base's
	// are sent (changedSpans). The server closes it.
	Base *os.File
	// More: the image is not the last one; the caller pulls again, Since
	// this one, once the source is no longer in use.
	More bool
}

// Images opens the image a request's source id names, once it is
// authorized. It must refuse ids it does not serve (an error wrapping
// errkind.ErrNotFound) and never open a path the id could escape to.
type Images interface {
	Open(ctx context.Context, r Request) (Image, error)
}

// Authorizer says whether a request may be served: nil, or an error that
// wraps errkind.ErrDenied (403) or errkind.ErrNotFound (404); any other
// error is a 500, which the puller may retry. It marks r.Move for a pull
// that moves a volume in use.
type Authorizer interface {
	Authorize(ctx context.Context, r *Request) error
}

// Checkpoint is how far a pull has got, for the target to keep and give
// back to resume.
type Checkpoint struct {
	// Identity of the image being copied; empty before the first answer.
	Identity string
	// Size of the image.
	Size int64
	// Verified: every byte before it is on disk (synced) and equal to the
	// source's.
	Verified int64
	// Base is the identity of the image the copy held whole before this
	// one's changes were applied to it (a pull Since it); empty for a
	// copy pulled from empty. A Checkpoint with a Base and no Identity is
	// a copy of Base, whole.
	Base string
}

// Progress is reported as a pull goes.
type Progress struct {
	// Done of Total bytes of data (the source's data extents from where
	// this pull started) have been received and checked.
	Done, Total int64
	// Checked of Resumed: a pull resumed from offset Resumed first checks
	// the copy up to there against the source (reading it back on both
	// nodes), then receives the rest.
	Checked, Resumed int64
	// Elapsed since this pull started.
	Elapsed time.Duration
}

// Rate is Done per second so far.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Done) / p.Elapsed.Seconds()
}

// Remaining estimates the time left at the rate so far; 0 when unknown.
func (p Progress) Remaining() time.Duration {
	r := p.Rate()
	if r <= 0 || p.Done >= p.Total {
		return 0
	}
	return time.Duration(float64(p.Total-p.Done) / r * float64(time.Second))
}

// Result says what a finished pull moved.
type Result struct {
	Checkpoint
	// Sent is the bytes of data that crossed the network; Zeros the bytes
	// of chunks of zeros sent as their length alone.
	Sent, Zeros int64
	// Resumed is the offset the pull started from (0: from the start).
	Resumed  int64
	Duration time.Duration
	// More: the source has more to send once what it serves is no longer
	// in use: pull again with Resume set to Holding(Checkpoint).
	More bool
}

// Holding is the checkpoint of a copy that holds the image cp names,
// whole: the next pull asks only for what changed since.
func Holding(cp Checkpoint) Checkpoint {
	return Checkpoint{Base: cp.Identity, Size: cp.Size}
}
