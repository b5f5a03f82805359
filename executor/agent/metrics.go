package agent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the agent's Prometheus metrics (docs/agent.md, "Metrics"):
// running tasks, tasks finished by reason, output bytes by
// stream, leftover processes killed, uploads by result and the upload retry
// backlog.
type Metrics struct {
	// Running is the number of tasks running now.
	Running prometheus.Gauge
	// Finished counts finished tasks by reason.
	Finished *prometheus.CounterVec
	// OutputBytes counts the output bytes of finished tasks by stream
	// ("stdout", "stderr").
	OutputBytes *prometheus.CounterVec
	// LeftoverKilled counts processes killed after their task's shell
	// exited, or found alive from an earlier incarnation.
	LeftoverKilled prometheus.Counter
	// Uploads counts upload attempts by result: "success" and "failure"
	// for a finished stream's object, "part_success" and "part_failure"
	// for the parts of a running one (docs/output.md).
	Uploads *prometheus.CounterVec
	// UploadBacklog is the number of streams waiting for a (re)try.
	UploadBacklog prometheus.Gauge
	// TaskShims counts the shims of tasks started at the tenant level by
	// source: "pool" (started ahead of the task) or "started" (the pool
	// was empty and the task waited for its shim's start).
	TaskShims *prometheus.CounterVec
	// FencedRequests counts Start, Cancel and Watch requests refused
	// because their leader fence was older than the newest seen, by RPC
	// ("Start", "Cancel", "Watch").
	FencedRequests *prometheus.CounterVec
	// LeaderEpoch is the newest leader epoch seen (the Lease's
	// leaseTransitions of the controller that sent it); 0 before any.
	LeaderEpoch prometheus.Gauge
	// EgressRefusals counts what workspaces' egress policies refused, by
	// reason: "dns" for a name the resolver refused (docs/egress.md).
	EgressRefusals *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, as in tests). It fails when a metric is already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "bashtask", "agent"
	m := &Metrics{
		Running: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "running_tasks", Help: "Number of tasks running now."}),
		Finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "tasks_finished_total", Help: "Tasks finished, by terminal reason."}, []string{"reason"}),
		OutputBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "output_bytes_total", Help: "Bytes written by finished tasks, by stream."}, []string{"stream"}),
		LeftoverKilled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "leftover_processes_killed_total", Help: "Processes killed after their task's shell exited or after an agent restart."}),
		Uploads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "uploads_total", Help: "Spill file upload attempts, by result."}, []string{"result"}),
		TaskShims: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "task_shims_total", Help: "Shims of tasks started at the tenant level, by source: pool (started ahead of the task) or started (the task waited for it)."}, []string{"source"}),
		UploadBacklog: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "upload_backlog", Help: "Streams whose upload has not succeeded yet."}),
		FencedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "fenced_requests_total", Help: "Requests refused because they came from a leader epoch older than the newest seen, by RPC."}, []string{"rpc"}),
		LeaderEpoch: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "leader_epoch", Help: "Newest controller leader epoch (Lease transitions) this agent has seen."}),
		EgressRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "egress_refusals_total", Help: "Refusals of workspaces' egress policies, by reason (dns: a name the resolver refused)."}, []string{"reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Running, m.Finished, m.OutputBytes, m.LeftoverKilled, m.Uploads, m.UploadBacklog, m.TaskShims, m.FencedRequests, m.LeaderEpoch, m.EgressRefusals} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
