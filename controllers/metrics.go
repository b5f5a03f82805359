package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/agentpool"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Metrics are the controller's Prometheus metrics, registered on the
// controller-runtime metrics registry by the binary.
type Metrics struct {
	// DispatchLatency is seconds from a task's creation to the agent's
	// acknowledgement of Start.
	DispatchLatency prometheus.Histogram
	// RunDuration is seconds from a task's start to its completion, as the
	// agent measured them.
	RunDuration prometheus.Histogram
	// Finished counts terminal tasks by reason.
	Finished *prometheus.CounterVec
	// StatusWrites counts status writes by kind: pending, dispatch,
	// pull (an image's pull progress), running, progress, terminal,
	// upload.
	StatusWrites *prometheus.CounterVec
	// StatusRegressions counts status writes that would have moved a task
	// backwards, by field: a terminal field (reason, message, exitCode,
	// signal, completionTime, phase) or startTime kept as first written,
	// or "refused" for a write not made (a phase going back, a lower
	// observedGeneration). Any count means a pass computed its status from
	// a stale view; the guard kept it out of the API.
	StatusRegressions *prometheus.CounterVec
	// OrphansStopped counts tasks an agent held whose BashTask no longer
	// existed with that UID, which the controller stopped and forgot.
	OrphansStopped prometheus.Counter
	// AgentsConnected is the number of agents with a working Watch stream.
	AgentsConnected prometheus.GaugeFunc
}

// NewMetrics creates the metrics; agents reports the connected agents for
// the gauge and may be nil.
func NewMetrics(agents func() []agentpool.AgentState) *Metrics {
	buckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	return &Metrics{
		DispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bashtask_dispatch_latency_seconds", Help: "Seconds from a BashTask's creation to its start on an agent.", Buckets: buckets,
		}),
		RunDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bashtask_run_duration_seconds", Help: "Seconds from a BashTask's start to its completion.", Buckets: buckets,
		}),
		Finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bashtask_finished_total", Help: "BashTasks that reached a terminal reason, by reason.",
		}, []string{"reason"}),
		StatusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bashtask_status_writes_total", Help: "BashTask status writes by kind.",
		}, []string{"kind"}),
		StatusRegressions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bashtask_status_regressions_total", Help: "BashTask status writes that would have gone backwards, by field kept (or refused for a write not made).",
		}, []string{"field"}),
		OrphansStopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bashtask_orphan_tasks_stopped_total", Help: "Tasks an agent held whose BashTask no longer existed with that UID, stopped and forgotten by the controller.",
		}),
		AgentsConnected: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "bashtask_agents_connected", Help: "Agents with a working Watch stream.",
		}, func() float64 {
			if agents == nil {
				return 0
			}
			n := 0
			for _, a := range agents() {
				if a.Connected {
					n++
				}
			}
			return float64(n)
		}),
	}
}

// Register adds every metric to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.DispatchLatency, m.RunDuration, m.Finished, m.StatusWrites, m.StatusRegressions, m.OrphansStopped, m.AgentsConnected} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) observeDispatch(bt *bashtaskv1alpha1.BashTask, now time.Time) {
	m.DispatchLatency.Observe(now.Sub(bt.CreationTimestamp.Time).Seconds())
}

func (m *Metrics) observeFinish(bt *bashtaskv1alpha1.BashTask) {
	m.Finished.WithLabelValues(string(reasonOf(&bt.Status))).Inc()
	if s, c := bt.Status.StartTime, bt.Status.CompletionTime; s != nil && c != nil {
		m.RunDuration.Observe(c.Sub(s.Time).Seconds())
	}
}

// workspacePhases is the bashtask_workspaces gauge: BashWorkspaces by
// phase, counted from the cache at each scrape, so it costs nothing
// between scrapes and is never out of step with the objects.
type workspacePhases struct {
	reader client.Reader
	desc   *prometheus.Desc
}

// NewWorkspacePhases returns the collector of bashtask_workspaces{phase}:
// the BashWorkspaces in each phase, read from reader (the manager's cache)
// at each scrape. Register it with the controller's metrics.
func NewWorkspacePhases(reader client.Reader) prometheus.Collector {
	return &workspacePhases{reader: reader, desc: prometheus.NewDesc("bashtask_workspaces", "BashWorkspaces by phase.", []string{"phase"}, nil)}
}

// Describe implements prometheus.Collector.
func (w *workspacePhases) Describe(ch chan<- *prometheus.Desc) { ch <- w.desc }

// Collect implements prometheus.Collector.
func (w *workspacePhases) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list bashtaskv1alpha1.BashWorkspaceList
	if err := w.reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(w.desc, err)
		return
	}
	counts := map[bashtaskv1alpha1.WorkspacePhase]int{}
	for i := range list.Items {
		counts[ptr.Deref(list.Items[i].Status.Phase, bashtaskv1alpha1.WorkspacePending)]++
	}
	for _, p := range []bashtaskv1alpha1.WorkspacePhase{bashtaskv1alpha1.WorkspacePending, bashtaskv1alpha1.WorkspaceReady,
		bashtaskv1alpha1.WorkspaceTerminating, bashtaskv1alpha1.WorkspaceNodeLost, bashtaskv1alpha1.WorkspaceFailed} {
		ch <- prometheus.MustNewConstMetric(w.desc, prometheus.GaugeValue, float64(counts[p]), string(p))
	}
}
