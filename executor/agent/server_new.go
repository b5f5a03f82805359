package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gocloud.dev/blob"
	"google.golang.org/grpc/health"

	"github.com/bashtask/bashtask-operator/executor"
)

// New prepares the state directory, opens the bucket, recovers the tasks of
// an earlier incarnation (stopping their leftover processes) and creates the
// executor. A missing shell is not an error here: the agent then serves,
// reports not ready and retries at each readiness check (case C28). It
// returns an error for a bad configuration, an unusable state directory or a
// bucket URL that cannot be opened.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is required")
	}
	if cfg.Executor.Isolation == executor.IsolationTenant && cfg.SharedIdentity && cfg.RunAs == nil {
		// The shim would stay root: the namespaces alone do not make a
		// tenant.
		return nil, errors.New("agent: a shared task identity at the tenant isolation level needs a user to run tasks as (--run-as-user)")
	}
	if _, err := ParseUnenforcedPolicy(string(cfg.UnenforcedLimits)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := prepareStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	fence, err := loadFencing(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	setDefaults(&cfg)
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		metrics:  cfg.Metrics,
		health:   health.NewServer(),
		wake:     make(chan struct{}, 1),
		stopCh:   make(chan struct{}),
		tasks:    map[string]*entry{},
		watchers: map[*watcher]struct{}{},
		fence:    fence,
		lease:    executor.NewLease(),
	}
	s.cfg.Executor.Lease = s.lease
	s.metrics.LeaderEpoch.Set(float64(fence.current().GetEpoch()))
	st, err := openStore(cfg.StateDir, filepath.Join(cfg.StateDir, "tasks"))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = st.close()
		}
	}()
	s.store = st
	if st.damaged != nil {
		s.log.Warn("record journal: discarded its damaged end (an agent killed mid-write leaves one)", "reason", st.damaged)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s.incarnation = hex.EncodeToString(id[:])
	if s.cfg.Executor.AmbientEnv == executor.AmbientInherit {
		s.log.Warn("ambient environment mode inherit: tasks receive this agent's whole environment without the credential scrub",
			"ambientEnv", string(executor.AmbientInherit))
	}

	if err := s.openBucket(ctx); err != nil {
		return nil, err
	}
	if err := s.configureTenant(); err != nil {
		return nil, err
	}
	// The workspaces' UIDs are held before any task's is handed out.
	if s.ws, err = newWorkspaces(s); err != nil {
		return nil, err
	}
	s.pf = newPortForwards(s)
	// After the workspaces are read: their images are held from the
	// store's opening on, before anything could evict them.
	tenant := cfg.Executor.Isolation == executor.IsolationTenant
	if s.images, err = newImages(cfg.Images, cfg.StateDir, tenant, s.ws.imageDigests(), s.log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = s.images.close()
		}
	}()
	// Recovery runs before the executor exists, so the earlier
	// incarnation's cgroups are gone before the new one sets up its parent.
	s.recoverTasks()
	s.mu.Lock()
	s.updateReadinessLocked()
	s.mu.Unlock()
	s.ws.takeUp(ctx)
	if s.images.store != nil {
		s.images.store.ReleaseOpenHolds()
	}
	return s, nil
}

func setDefaults(cfg *Config) {
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.UploadBackoffInitial <= 0 {
		cfg.UploadBackoffInitial = DefaultUploadBackoffInitial
	}
	if cfg.UploadBackoffMax <= 0 {
		cfg.UploadBackoffMax = DefaultUploadBackoffMax
	}
	if cfg.UploadTimeout <= 0 {
		cfg.UploadTimeout = DefaultUploadTimeout
	}
	if cfg.PartBytes == 0 {
		cfg.PartBytes = DefaultPartBytes
	}
	if cfg.PartInterval <= 0 {
		cfg.PartInterval = DefaultPartInterval
	}
	if cfg.ReadinessInterval <= 0 {
		cfg.ReadinessInterval = DefaultReadinessInterval
	}
	if cfg.WatchBuffer <= 0 {
		cfg.WatchBuffer = DefaultWatchBuffer
	}
	if cfg.DrainUnwatchedLimit <= 0 {
		cfg.DrainUnwatchedLimit = DefaultDrainUnwatchedLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	if cfg.Executor.Shell == "" {
		cfg.Executor.Shell = executor.DefaultShell
	}
}

// credentialEnv name files of cloud credentials the bucket drivers read,
// and serviceAccountDirs the agent pod's Kubernetes credentials.
var (
	credentialEnv = []string{
		"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE",
	}
	serviceAccountDirs = []string{"/var/run/secrets/kubernetes.io", "/run/secrets/kubernetes.io", "/var/run/secrets/eks.amazonaws.com"}
)

// credentialFiles lists the credential files and directories hidden from
// tenant tasks: those named by credentialEnv in the agent's environment
// (absolute paths only) and serviceAccountDirs.
func credentialFiles(getenv func(string) string) []string {
	var out []string
	for _, name := range credentialEnv {
		if v := getenv(name); filepath.IsAbs(v) {
			out = append(out, v)
		}
	}
	return append(out, serviceAccountDirs...)
}

// openBucket opens the bucket uploads go to, by default a directory in the
// state directory, and keeps the URL that object URLs in statuses start
// with.
func (s *Server) openBucket(ctx context.Context) error {
	bucketURL := s.cfg.BucketURL
	if bucketURL == "" {
		dir := filepath.Join(s.cfg.StateDir, "uploads")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("creating default upload directory: %w", err)
		}
		// Temporary files next to the objects: the state directory is
		// usually a hostPath on another file system than /tmp, and
		// fileblob renames them into place.
		bucketURL = "file://" + dir + "?no_tmp_dir=true"
		s.cfg.BucketURL = bucketURL
		// This node's own directory: a snapshot written here restores
		// nowhere else, so the agent offers none.
		s.nodeLocalBucket = true
	}
	u, err := url.Parse(bucketURL)
	if err != nil {
		return fmt.Errorf("parsing bucket URL: %w", err)
	}
	// Object URLs in statuses name the bucket and key only: no query
	// parameters or user information that might hold credentials.
	u.RawQuery, u.Fragment, u.User = "", "", nil
	s.bucketBase = strings.TrimSuffix(u.String(), "/")
	if s.bucket, err = blob.OpenBucket(ctx, bucketURL); err != nil {
		return fmt.Errorf("opening bucket %s: %w", s.bucketBase, err)
	}
	return nil
}

// configureTenant adds what the tenant isolation level needs to the
// executor's configuration and the server: the paths hidden from tasks and
// the range of UIDs leased to them.
func (s *Server) configureTenant() error {
	if s.cfg.Executor.Isolation == executor.IsolationTenant {
		// Tasks must not read the records, output and uploads of others,
		// nor the bucket's credentials, whatever the files' modes.
		s.cfg.Executor.MaskPaths = append(slices.Clip(s.cfg.Executor.MaskPaths), credentialFiles(os.Getenv)...)
		stateDir, err := filepath.Abs(s.cfg.StateDir)
		if err != nil {
			return fmt.Errorf("the state directory %s: %w", s.cfg.StateDir, err)
		}
		s.cfg.Executor.MaskPaths = append(s.cfg.Executor.MaskPaths, stateDir)
		if d := s.cfg.Images.CacheDir; d != "" {
			// Layers hold set-ID files and other tenants' images.
			s.cfg.Executor.MaskPaths = append(s.cfg.Executor.MaskPaths, d)
		}
		if s.cfg.Executor.DiskQuotaBytes > 0 && s.cfg.Executor.DiskImageDir == "" {
			// The working directories' images: the agent's own, hidden
			// from tasks with the rest of the state directory.
			s.cfg.Executor.DiskImageDir = filepath.Join(stateDir, "disk-images")
		}
	}
	if s.cfg.Executor.Isolation == executor.IsolationTenant && !s.cfg.SharedIdentity {
		r := s.cfg.TaskUIDs
		if r == (UIDRange{}) {
			r = DefaultTaskUIDRange
		}
		s.leases = newUIDLeases(r)
	}
	return nil
}
