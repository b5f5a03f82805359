package main

import (
	"strings"
	"testing"
	"time"
)

func TestCheckLeaseTimes(t *testing.T) {
	for name, tc := range map[string]struct {
		lease, renew, retry time.Duration
		wantErr             string
	}{
		"defaults":                  {lease: 15 * time.Second, renew: 10 * time.Second, retry: 2 * time.Second},
		"short":                     {lease: 4 * time.Second, renew: 3 * time.Second, retry: 500 * time.Millisecond},
		"lease equals renew":        {lease: 10 * time.Second, renew: 10 * time.Second, retry: time.Second, wantErr: "--leader-election-lease-duration (10s) must be longer than --leader-election-renew-deadline (10s)"},
		"renew within retry jitter": {lease: 10 * time.Second, renew: 1200 * time.Millisecond, retry: time.Second, wantErr: "--leader-election-renew-deadline (1.2s) must be longer than 1.2 times --leader-election-retry-period (1s)"},
		"zero retry":                {lease: 10 * time.Second, renew: 5 * time.Second, wantErr: "--leader-election-retry-period must be positive, got 0s"},
	} {
		t.Run(name, func(t *testing.T) {
			err := checkLeaseTimes(tc.lease, tc.renew, tc.retry)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
