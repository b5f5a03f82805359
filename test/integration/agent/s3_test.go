package agent_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
)

// s3Server is a versitygw process with a posix backend on loopback.
type s3Server struct {
	endpoint       string
	access, secret string
	client         *s3.Client
}

const s3Region = "us-east-1"

func startS3(t *testing.T) *s3Server {
	t.Helper()
	bin := versitygwBin(t)
	s := &s3Server{access: "AK" + randomHex(t, 8), secret: randomHex(t, 20)}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	s.endpoint = "http://" + addr
	cmd := exec.Command(bin, "--port", addr, "--access", s.access, "--secret", s.secret, "--region", s3Region,
		"posix", t.TempDir())
	logs := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("versitygw log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("versitygw exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw not listening on %s after 20 s:\n%s", addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.client = s3.New(s3.Options{
		Region:       s3Region,
		BaseEndpoint: aws.String(s.endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.access, s.secret, ""),
	})
	return s
}

func (s *s3Server) bucketURL(bucket string) string {
	return fmt.Sprintf("s3://%s?endpoint=%s&region=%s&use_path_style=true", bucket, s.endpoint, s3Region)
}

// agentEnv is the agent's environment for the bucket's credentials.
func (s *s3Server) agentEnv() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.access, "AWS_SECRET_ACCESS_KEY=" + s.secret, "AWS_REGION=" + s3Region}
}

func (s *s3Server) createBucket(t *testing.T, bucket string) {
	t.Helper()
	if _, err := s.client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("creating bucket %s: %v", bucket, err)
	}
}

// object returns an object's bytes and user metadata.
func (s *s3Server) object(t *testing.T, bucket, key string) ([]byte, map[string]string) {
	t.Helper()
	out, err := s.client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("getting s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return data, out.Metadata
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func seqSpec(uid string) *agentv1.TaskSpec {
	return &agentv1.TaskSpec{
		Ref:     &agentv1.TaskRef{Namespace: "ns", Name: "seq", Uid: uid},
		Command: "seq -f 'line-%04g' 1 20000",
		Timeout: durationpb.New(60 * time.Second),
	}
}

// checkObject compares the uploaded object with the task's stdout status.
func checkObject(t *testing.T, s *s3Server, bucket, uid string, stdout *agentv1.StreamStatus) {
	t.Helper()
	data, meta := s.object(t, bucket, "ns/seq/"+uid+"/stdout")
	sum := sha256.Sum256(data)
	got := map[string]string{
		"bytes": strconv.Itoa(len(data)), "sha256": hex.EncodeToString(sum[:]),
		"meta sha256": meta["sha256"], "meta bytes": meta["bytes"], "meta complete": meta["complete"],
	}
	total := strconv.FormatInt(stdout.GetTotalBytes(), 10)
	want := map[string]string{
		"bytes": total, "sha256": stdout.GetSha256(),
		"meta sha256": stdout.GetSha256(), "meta bytes": total, "meta complete": "true",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("object s3://%s/ns/seq/%s/stdout against the status (-want +got):\n%s", bucket, uid, diff)
	}
	if !strings.HasPrefix(string(data), "line-0001\n") || !strings.HasSuffix(string(data), "line-20000\n") {
		t.Errorf("object does not hold the whole stream: starts %q, ends %q", data[:min(10, len(data))], data[max(0, len(data)-11):])
	}
}

// TestUploadToS3 is case C23 at the agent level: the tail is the end of the
// stream, and the object in a real S3 server is byte-identical to the
// stream with the status's SHA-256.
func TestUploadToS3(t *testing.T) {
	s := startS3(t)
	s.createBucket(t, "outputs")
	p := newPKI(t)
	a := startAgent(t, p, t.TempDir()+"/state", s.bucketURL("outputs"), s.agentEnv())
	c := a.client(t, p)
	w := watch(t, c)
	const uid = "c23"
	if _, err := c.Start(t.Context(), &agentv1.StartRequest{Spec: seqSpec(uid)}); err != nil {
		t.Fatal(err)
	}
	fin := w.until(uid, 30*time.Second, "finish", isType(agentv1.EventType_EVENT_TYPE_FINISHED)).GetStatus()
	out := fin.GetStdout()
	// seq prints 9999 lines of 10 bytes and 10001 of 11.
	if out.GetTotalBytes() != 210001 || !out.GetTruncated() || strings.Contains(out.GetTail(), "line-0001\n") ||
		!strings.HasSuffix(out.GetTail(), "line-20000\n") {
		t.Errorf("stdout status: total %d truncated %v tail ...%q; want 210001 bytes, truncated, ending in line-20000 without line-0001",
			out.GetTotalBytes(), out.GetTruncated(), out.GetTail()[max(0, len(out.GetTail())-22):])
	}
	up := w.until(uid, 30*time.Second, "upload", isType(agentv1.EventType_EVENT_TYPE_UPLOADED)).GetStatus()
	if got, want := up.GetStdout().GetSpill().GetUrl(), "s3://outputs/ns/seq/"+uid+"/stdout"; got != want {
		t.Errorf("spill url %q, want %q", got, want)
	}
	checkObject(t, s, "outputs", uid, out)

	// Forgotten, the task's stream is still served by the agent from the
	// object, by the URL its status records: range reads on S3.
	if _, err := c.Forget(t.Context(), &agentv1.ForgetRequest{Uid: uid}); err != nil {
		t.Fatal(err)
	}
	w.until(uid, 30*time.Second, "forget", isType(agentv1.EventType_EVENT_TYPE_FORGOTTEN))
	whole, _ := s.object(t, "outputs", "ns/seq/"+uid+"/stdout")
	url := up.GetStdout().GetSpill().GetUrl()
	for _, r := range []struct{ offset, limit int64 }{{0, 0}, {100001, 0}, {5, 20}, {210001, 0}} {
		got, err := readObject(t, c, &agentv1.ReadOutputRequest{Uid: uid, ObjectUrl: url, Offset: r.offset, LimitBytes: r.limit})
		want := whole[r.offset:]
		if r.limit > 0 {
			want = want[:r.limit]
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("ReadOutput of %s from %d, limit %d: %d bytes, %v; want %d", url, r.offset, r.limit, len(got), err, len(want))
		}
	}
	if _, err := readObject(t, c, &agentv1.ReadOutputRequest{Uid: uid, ObjectUrl: "s3://other/ns/seq/" + uid + "/stdout"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ReadOutput of another bucket's object: %v, want FailedPrecondition", err)
	}
}

// readObject reads a ReadOutput stream's data to its end message.
func readObject(t *testing.T, c agentv1.ExecutorClient, req *agentv1.ReadOutputRequest) ([]byte, error) {
	t.Helper()
	stream, err := c.ReadOutput(t.Context(), req)
	if err != nil {
		return nil, err
	}
	var data []byte
	for {
		m, err := stream.Recv()
		if err != nil {
			return data, err
		}
		if m.GetEnd() != nil {
			return data, nil
		}
		if m.GetHeader() == nil && m.GetOffset() != req.GetOffset()+int64(len(data)) {
			return data, fmt.Errorf("chunk at offset %d after %d bytes from %d", m.GetOffset(), len(data), req.GetOffset())
		}
		data = append(data, m.GetData()...)
	}
}

// TestUploadFailureThenRecovery: the bucket does not exist at first, so
// uploads fail; the task still finishes at once, the local file is kept and
// retried with backoff, and once the bucket exists the upload succeeds and
// Forget can drop the files.
func TestUploadFailureThenRecovery(t *testing.T) {
	s := startS3(t)
	p := newPKI(t)
	a := startAgent(t, p, t.TempDir()+"/state", s.bucketURL("late"), s.agentEnv(),
		"--upload-backoff-initial", "100ms", "--upload-backoff-max", "400ms")
	c := a.client(t, p)
	w := watch(t, c)
	const uid = "late-1"
	if _, err := c.Start(t.Context(), &agentv1.StartRequest{Spec: seqSpec(uid)}); err != nil {
		t.Fatal(err)
	}
	fin := w.until(uid, 30*time.Second, "finish", isType(agentv1.EventType_EVENT_TYPE_FINISHED)).GetStatus()
	if st := fin.GetStdout().GetSpill().GetUploadState(); st != agentv1.UploadState_UPLOAD_STATE_PENDING {
		t.Fatalf("upload state at finish %v, want PENDING", st)
	}
	err := poll(20*time.Second, func() error {
		g, err := c.Get(t.Context(), &agentv1.GetRequest{Uid: uid})
		if err != nil {
			return err
		}
		if sp := g.GetStatus().GetStdout().GetSpill(); sp.GetUploadAttempts() < 2 || sp.GetUploadError() == "" {
			return fmt.Errorf("%d failed attempts (%q): %w", sp.GetUploadAttempts(), sp.GetUploadError(), errNotYet)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if f, err := c.Forget(t.Context(), &agentv1.ForgetRequest{Uid: uid}); err != nil || f.GetForgotten() {
		t.Fatalf("Forget with a pending upload: %v, %v; want kept until uploaded", f, err)
	}

	s.createBucket(t, "late")
	w.until(uid, 30*time.Second, "upload", isType(agentv1.EventType_EVENT_TYPE_UPLOADED))
	w.until(uid, 30*time.Second, "forget after upload", isType(agentv1.EventType_EVENT_TYPE_FORGOTTEN))
	checkObject(t, s, "late", uid, fin.GetStdout())
}

// poll calls f until it returns nil or an error not wrapping errNotYet, or
// the timeout passes.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || !errors.Is(err, errNotYet) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
