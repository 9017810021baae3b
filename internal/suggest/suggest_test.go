package suggest

import "testing"

func TestClosest(t *testing.T) {
	cols := []string{"id", "name", "amount", "created_at"}
	for name, want := range map[string]string{
		"nmae": "name", "amuont": "amount", "created": "created_at", "tmount": "amount", "ID": "id", "craeted_at": "created_at", "zzzz": "",
	} {
		if got := Closest(name, cols); got != want {
			t.Errorf("Closest(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestList(t *testing.T) {
	got := List("the table has columns", "nmae", []string{"id", "name"})
	want := `the table has columns "id", "name"; did you mean "name"?`
	if got != want {
		t.Errorf("List = %s, want %s", got, want)
	}
	if got := List("the table has columns", "x", nil); got != "the table has columns none" {
		t.Errorf("List of none = %s", got)
	}
}
