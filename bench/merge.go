package main

import (
	"strings"
)

// A report is a header (the title and the run's bullets: command, date,
// machine) and sections, each from a line "## " to the next. -merge puts
// the sections of one run into a report recorded by another: each section
// of the run replaces the recorded section of the same heading, or is
// added at the end, and starts with the run's own header bullets, so that
// it still says which run measured it.

// reportSection is one "## " section of a report.
type reportSection struct {
	heading string // the "## " line
	text    string // the whole section, heading included
}

// splitReport returns the header of report and its sections in order.
func splitReport(report string) (header string, sections []reportSection) {
	lines := strings.SplitAfter(report, "\n")
	i := 0
	for i < len(lines) && !strings.HasPrefix(lines[i], "## ") {
		header += lines[i]
		i++
	}
	for i < len(lines) {
		s := reportSection{heading: strings.TrimSpace(lines[i]), text: lines[i]}
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "## "); i++ {
			s.text += lines[i]
		}
		sections = append(sections, s)
	}
	return header, sections
}

// mergeReport returns recorded with the sections of run in place of those
// of the same heading, the others added at the end, each with the run's
// header bullets after its heading.
func mergeReport(recorded, run string) string {
	header, sections := splitReport(recorded)
	runHeader, runSections := splitReport(run)
	var bullets []string
	for _, line := range strings.Split(runHeader, "\n") {
		if strings.HasPrefix(line, "- ") {
			bullets = append(bullets, line)
		}
	}
	provenance := "From a run of its own:\n\n" + strings.Join(bullets, "\n") + "\n\n"
	for _, rs := range runSections {
		heading, body, _ := strings.Cut(rs.text, "\n")
		rs.text = heading + "\n\n" + provenance + strings.TrimLeft(body, "\n")
		replaced := false
		for i := range sections {
			if sections[i].heading == rs.heading {
				sections[i].text, replaced = rs.text, true
			}
		}
		if !replaced {
			if n := len(sections); n > 0 && !strings.HasSuffix(sections[n-1].text, "\n\n") {
				sections[n-1].text += "\n"
			}
			sections = append(sections, rs)
		}
	}
	var b strings.Builder
	b.WriteString(header)
	for _, s := range sections {
		b.WriteString(s.text)
	}
	return b.String()
}
