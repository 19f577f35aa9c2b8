package devicetest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/podvol/podvol/internal/device"
)

// Filesystem signatures: what mkfs writes at the start of an image.

const magic = "PODVOL-DEVICETEST-SIGNATURE\n"

// Signature is what mkfs wrote at the start of an image.
type Signature struct {
	Type   string `json:"type"` // ext4, xfs, or anything planted (swap...)
	UUID   string `json:"uuid,omitempty"`
	Size   int64  `json:"size,omitempty"` // the filesystem's size
	Group  int    `json:"group"`          // the root directory's group
	Setgid bool   `json:"setgid,omitempty"`
	// Sector is the filesystem's sector size (ext4: block size); a device
	// whose logical block size is larger cannot mount it. 0: 512, as
	// signatures written before sector sizes were modelled.
	Sector int `json:"sector,omitempty"`
}

func (s *Signature) sector() int {
	if s.Sector == 0 {
		return device.LegacyBlockSize
	}
	return s.Sector
}

// ReadSignature returns the signature at the start of an image file or
// device; nil if it has none (blank, or data blkid would not recognise).
func ReadSignature(path string) (*Signature, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return readSig(file)
}

// WriteSignature plants a signature of type typ at the start of an image
// file, as mkfs, mkswap or a partitioning tool would.
func WriteSignature(path, typ string) error {
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer file.Close()
	return writeSig(file, &Signature{Type: typ, UUID: newUUID()})
}

func readSig(file *os.File) (*Signature, error) {
	buf := make([]byte, 4096)
	n, err := file.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	rest, ok := bytes.CutPrefix(buf[:n], []byte(magic))
	if !ok {
		return nil, nil
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	s := &Signature{}
	if err := json.Unmarshal(line, s); err != nil {
		return nil, fmt.Errorf("devicetest: corrupt signature: %w", err)
	}
	return s, nil
}

func writeSig(file *os.File, s *Signature) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	buf := append([]byte(magic), b...)
	buf = append(buf, '\n')
	_, err = file.WriteAt(buf, 0)
	return err
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
