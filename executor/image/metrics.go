package image

import "github.com/prometheus/client_golang/prometheus"

// metrics are the store's Prometheus metrics (docs/images.md, "The node's
// image store").
type metrics struct {
	cacheBytes prometheus.Gauge
	images     prometheus.Gauge
	hits       prometheus.Counter
	misses     prometheus.Counter
	downloaded prometheus.Counter
	evictions  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "bashtask", "agent_image"
	m := &metrics{
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "cache_bytes", Help: "Unpacked bytes of the layers in the node's image store (file data, holes not counted)."}),
		images: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "images", Help: "Images in the node's image store."}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cache_hits_total", Help: "Pulls whose layers were all in the store already."}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cache_misses_total", Help: "Pulls that fetched at least one layer."}),
		downloaded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "downloaded_bytes_total", Help: "Compressed layer bytes downloaded from registries."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "evictions_total", Help: "Images evicted to keep the store within its budget."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.cacheBytes, m.images, m.hits, m.misses, m.downloaded, m.evictions} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
