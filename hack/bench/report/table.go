package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Table prints rows of cells in aligned columns, two spaces apart: every
// table of hack/bench. Rows are added with Row or Rowf, or written as
// tab-separated lines ("cell\tcell\t\n") to the Table itself, an
// io.Writer.
type Table struct {
	tw *tabwriter.Writer
}

// NewTable returns a table written to w; alignRight aligns every column
// to the right (the executor's table), otherwise to the left.
func NewTable(w io.Writer, alignRight bool) *Table {
	var flags uint
	if alignRight {
		flags = tabwriter.AlignRight
	}
	return &Table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', flags)}
}

// Row adds a row of cells.
func (t *Table) Row(cells ...string) {
	fmt.Fprintf(t.tw, "%s\t\n", strings.Join(cells, "\t"))
}

// Rowf adds a row whose cells are format's tab-separated fields, filled
// in as by fmt.Sprintf; the format does not end with a tab or a newline.
func (t *Table) Rowf(format string, args ...any) {
	fmt.Fprintf(t.tw, format+"\t\n", args...)
}

// Write takes tab-separated rows, as a tabwriter.Writer does.
func (t *Table) Write(p []byte) (int, error) { return t.tw.Write(p) }

// Flush prints the rows added so far.
func (t *Table) Flush() error { return t.tw.Flush() }
