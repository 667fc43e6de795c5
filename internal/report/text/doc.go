// Package text writes a trace's verdict (WriteHealth) and its report
// (WriteReport) as the human text `validate` and `report` print, and holds
// the table and unit helpers (FormatNS, FormatBytes, Table, Section) the
// other text outputs share. It imports analysis, health and trace.
package text
