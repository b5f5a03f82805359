package outputkey

import "testing"

func TestPartKeys(t *testing.T) {
	p := PartsPrefix(Object("ns", "n", "u", "stdout"))
	if p != "ns/n/u/stdout.parts/" {
		t.Errorf("PartsPrefix %q", p)
	}
	k := Part(p, 1<<20)
	if k != p+"0000000001048576" {
		t.Errorf("Part %q", k)
	}
	if off, ok := ParsePart(p, k); !ok || off != 1<<20 {
		t.Errorf("ParsePart(%q) = %d, %v", k, off, ok)
	}
	if Part(p, 9) > Part(p, 10) {
		t.Errorf("part keys do not sort in stream order: %s > %s", Part(p, 9), Part(p, 10))
	}
	for _, bad := range []string{k + ".attrs", p + "1048576", "ns/n/u/stderr.parts/0000000001048576", p + "-000000000000001", p + "+000000000000001"} {
		if _, ok := ParsePart(p, bad); ok {
			t.Errorf("ParsePart(%q) accepted", bad)
		}
	}
}
