package transfer

// boundedError is err with its text passed through peerText: an HTTP
// client's error quotes a malformed header line of the source's whole (up
// to the transport's 10 MiB of headers, escapes and all).
type boundedError struct{ err error }

func (e boundedError) Error() string { return peerText(e.err.Error()) }
func (e boundedError) Unwrap() error { return e.err }
