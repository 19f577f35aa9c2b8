package debpkg

import "strings"

// CompareVersions orders two Debian version strings ([epoch:]upstream[-revision])
// as dpkg does: <0, 0 or >0. The suites of one archive may hold several
// versions of a package (a point release and its security update); the
// highest wins, as with apt.
func CompareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if c := compareNumber(ea, eb); c != 0 {
		return c
	}
	if c := compareFragment(ua, ub); c != 0 {
		return c
	}
	return compareFragment(ra, rb)
}

func splitVersion(v string) (epoch, upstream, revision string) {
	epoch = "0"
	if i := strings.IndexByte(v, ':'); i >= 0 {
		epoch, v = v[:i], v[i+1:]
	}
	upstream = v
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		upstream, revision = v[:i], v[i+1:]
	}
	return epoch, upstream, revision
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// order is dpkg's weight of a non-digit character: '~' before everything,
// even the end of the string; letters before other characters.
func order(c byte) int {
	switch {
	case c == '~':
		return -1
	case isDigit(c):
		return 0
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		return int(c)
	default:
		return int(c) + 256
	}
}

func compareNumber(a, b string) int {
	a = strings.TrimLeft(a, "0")
	b = strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		if len(a) < len(b) {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

func compareFragment(a, b string) int {
	for a != "" || b != "" {
		// The non-digit prefixes, character by character.
		for (a != "" && !isDigit(a[0])) || (b != "" && !isDigit(b[0])) {
			ca, cb := 0, 0
			if a != "" && !isDigit(a[0]) {
				ca = order(a[0])
			}
			if b != "" && !isDigit(b[0]) {
				cb = order(b[0])
			}
			if ca != cb {
				if ca < cb {
					return -1
				}
				return 1
			}
			a, b = a[1:], b[1:]
		}
		i, j := 0, 0
		for i < len(a) && isDigit(a[i]) {
			i++
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		if c := compareNumber(a[:i], b[:j]); c != 0 {
			return c
		}
		a, b = a[i:], b[j:]
	}
	return 0
}
