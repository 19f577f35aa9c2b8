package directvolume

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// DefaultSandboxDirs are where Kata's runtimes keep a sandbox's sockets
// (the Go runtime, then runtime-rs).
var DefaultSandboxDirs = []string{"/run/vc/sbs", "/run/kata"}

// ErrNoSandbox means the volume is assigned but no sandbox has taken it yet.
var ErrNoSandbox = errors.New("not running in a sandbox yet")

// Usage is one entry of the shim's stats answer. Unit 1 is bytes, 2 inodes.
type Usage struct {
	Available int64 `json:"available,omitempty"`
	Total     int64 `json:"total,omitempty"`
	Used      int64 `json:"used,omitempty"`
	Unit      int   `json:"unit,omitempty"`
}

// Condition is the shim's view of the volume's health.
type Condition struct {
	Abnormal bool   `json:"abnormal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Stats is the shim's stats answer.
type Stats struct {
	Usage     []Usage    `json:"usage"`
	Condition *Condition `json:"volume_condition,omitempty"`
}

// Shim talks to the runtime's shim of the sandbox that holds a volume.
type Shim struct {
	Root        string
	SandboxDirs []string
}

// socket finds the shim monitor socket of the sandbox using target.
func (s *Shim) socket(target string) (string, error) {
	id, err := Sandbox(s.Root, target)
	if err != nil {
		return "", err
	}
	if id == "" {
		return "", ErrNoSandbox
	}
	for _, d := range s.SandboxDirs {
		sock := filepath.Join(d, id, "shim-monitor.sock")
		if _, err := os.Stat(sock); err == nil {
			return sock, nil
		}
	}
	return "", fmt.Errorf("sandbox %s has no shim-monitor.sock in %v: %w", id, s.SandboxDirs, ErrNoSandbox)
}

func client(sock string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}
}

// Stats asks the shim for the usage of device as the guest sees it.
func (s *Shim) Stats(ctx context.Context, target, device string) (*Stats, error) {
	sock, err := s.socket(target)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://shim/direct-volume/stats?path="+url.PathEscape(device), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client(sock).Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the runtime for stats of %s: %w", device, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the runtime answered stats of %s with %s: %s", device, resp.Status, bytes.TrimSpace(body))
	}
	st := &Stats{}
	if err := json.Unmarshal(body, st); err != nil {
		return nil, fmt.Errorf("decode the runtime's stats of %s: %w", device, err)
	}
	return st, nil
}

// Resize asks the shim to grow the volume in the guest to size bytes.
func (s *Shim) Resize(ctx context.Context, target, device string, size int64) error {
	sock, err := s.socket(target)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(struct {
		VolumePath string
		Size       int64
	}{device, size})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://shim/direct-volume/resize", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client(sock).Do(req)
	if err != nil {
		return fmt.Errorf("ask the runtime to resize %s: %w", device, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the runtime refused to resize %s in the guest: %s: %s", device, resp.Status, bytes.TrimSpace(answer))
	}
	return nil
}
