// Package docs holds the checks that keep the repository's markdown usable:
// every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/
// must reach a file that exists and, with a #fragment, a heading in it. A
// newcomer follows those links first; a moved section must not strand them.
package docs
