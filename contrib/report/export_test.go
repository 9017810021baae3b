package report

// FormatBytes is fmtBytes, for the tests.
var FormatBytes = fmtBytes
