package conformance

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"regexp"
	"strings"
)

// WriteHTML writes the Markdown report as one self-contained HTML page (inline style, no
// script, nothing fetched from the network), for a vendor to open in a browser or publish as
// is. It renders exactly what WriteMarkdown writes, so the two never say different things.
func (r *Report) WriteHTML(w io.Writer) error {
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		return err
	}
	title := "xpu conformance: " + r.Backend.Name
	b := &strings.Builder{}
	fmt.Fprintf(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n", html.EscapeString(title))
	b.WriteString("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n")
	b.WriteString("<style>\n" + reportCSS + "</style>\n</head>\n<body>\n")
	fmt.Fprintf(b, "<div class=\"summary %s\">%s</div>\n", summaryClass(r), html.EscapeString(r.Summary()))
	markdownHTML(b, md.String())
	b.WriteString("</body>\n</html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func summaryClass(r *Report) string {
	if r.Failed > 0 {
		return "bad"
	}
	return "good"
}

const reportCSS = `body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; color: #1b1f23; }
h1 { font-size: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { font-size: 1.25em; margin-top: 1.6em; }
h3 { font-size: 1.05em; }
code { font: 12px ui-monospace, monospace; background: #f3f4f6; padding: .1em .3em; border-radius: 3px; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fafbfc; }
.summary { font-size: 1.2em; font-weight: 600; padding: .5em .8em; border-radius: 6px; display: inline-block; }
.good { background: #dafbe1; color: #116329; }
.bad { background: #ffebe9; color: #a40e26; }
`

var (
	mdCode = regexp.MustCompile("`([^`]*)`")
	mdBold = regexp.MustCompile(`\*\*([^*]+)\*\*`)
)

// markdownInline renders a line's code spans and bold text; everything else is escaped.
func markdownInline(s string) string {
	var out strings.Builder
	last := 0
	for _, m := range mdCode.FindAllStringSubmatchIndex(s, -1) {
		out.WriteString(mdBold.ReplaceAllString(html.EscapeString(s[last:m[0]]), "<strong>$1</strong>"))
		out.WriteString("<code>" + html.EscapeString(s[m[2]:m[3]]) + "</code>")
		last = m[1]
	}
	out.WriteString(mdBold.ReplaceAllString(html.EscapeString(s[last:]), "<strong>$1</strong>"))
	return out.String()
}

// tableCells splits a Markdown table row; a `|` inside a code span (an escaped "\|" in
// Markdown) does not split.
func tableCells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '`':
			inCode = !inCode
		case c == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
			continue
		case c == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

var mdTableRule = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+$`)

// markdownHTML renders the Markdown subset the reports use: ATX headings, "- " lists, pipe
// tables with a header rule, paragraphs, code spans and bold.
func markdownHTML(b *strings.Builder, md string) {
	lines := strings.Split(md, "\n")
	var para []string
	flush := func() {
		if len(para) > 0 {
			b.WriteString("<p>" + markdownInline(strings.Join(para, " ")) + "</p>\n")
			para = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		t := strings.TrimSpace(line)
		switch {
		case t == "":
			flush()
		case strings.HasPrefix(t, "#"):
			flush()
			n := len(t) - len(strings.TrimLeft(t, "#"))
			if n > 6 || len(t) == n || t[n] != ' ' {
				para = append(para, t)
				continue
			}
			fmt.Fprintf(b, "<h%d>%s</h%d>\n", n, markdownInline(strings.TrimSpace(t[n:])), n)
		case strings.HasPrefix(t, "- "):
			flush()
			b.WriteString("<ul>\n")
			for ; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "- "); i++ {
				b.WriteString("<li>" + markdownInline(strings.TrimSpace(lines[i])[2:]) + "</li>\n")
			}
			i--
			b.WriteString("</ul>\n")
		case strings.HasPrefix(t, "|") && i+1 < len(lines) && mdTableRule.MatchString(strings.ReplaceAll(strings.TrimSpace(lines[i+1]), " ", "")):
			flush()
			b.WriteString("<table>\n<thead><tr>")
			for _, c := range tableCells(t) {
				b.WriteString("<th>" + markdownInline(c) + "</th>")
			}
			b.WriteString("</tr></thead>\n<tbody>\n")
			for i += 2; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
				b.WriteString("<tr>")
				for _, c := range tableCells(lines[i]) {
					b.WriteString("<td>" + markdownInline(c) + "</td>")
				}
				b.WriteString("</tr>\n")
			}
			i--
			b.WriteString("</tbody>\n</table>\n")
		default:
			para = append(para, t)
		}
	}
	flush()
}
