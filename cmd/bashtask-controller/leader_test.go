package main

import (
	"strings"
	"testing"
	"time"
)

func TestCheckLeaderTimings(t *testing.T) {
	tests := map[string]struct {
		lease, renew, retry time.Duration
		want                string // substring of the error; "" for none
	}{
		"defaults":                     {15 * time.Second, 10 * time.Second, 2 * time.Second, ""},
		"short, for tests":             {4 * time.Second, 3 * time.Second, 500 * time.Millisecond, ""},
		"renew deadline equals lease":  {10 * time.Second, 10 * time.Second, 2 * time.Second, "must be longer than --leader-election-renew-deadline"},
		"retry too close to the renew": {15 * time.Second, 2 * time.Second, 2 * time.Second, "more than 1.2"},
		"zero":                         {0, 10 * time.Second, 2 * time.Second, "must be positive"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := &options{leaseDuration: tc.lease, renewDeadline: tc.renew, retryPeriod: tc.retry}
			err := o.checkLeaderTimings()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}
