package pgconv

// convertBytea converts v for a bytea column: bytes or text.
func convertBytea(_ *Column, v, _ any) (any, string) {
	switch x := v.(type) {
	case []byte:
		return x, ""
	case string:
		return []byte(x), ""
	}
	return nil, wrongType(v, "bytea")
}
