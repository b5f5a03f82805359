package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"strings"

	"gocloud.dev/blob"
	// The bucket kinds an agent may upload to (DESIGN.md section 5). Each
	// driver finds the user's own credentials the way its cloud's tools do
	// (AWS_PROFILE and ~/.aws, gcloud application-default credentials,
	// AZURE_* variables); the plugin holds none.
	_ "gocloud.dev/blob/azureblob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"
	"gocloud.dev/gcerrors"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// objectKey is where an agent stores a task's stream in its bucket:
// <namespace>/<name>/<uid>/<stream>.
func objectKey(bt *bashtaskv1alpha1.BashTask, stream string) string {
	return path.Join(bt.Namespace, bt.Name, string(bt.UID), stream)
}

// splitObjectURL splits a status spill.url into the bucket URL and the
// object key. The key is the known suffix; should a bucket layout ever put
// something else there, the last four path segments are the key. query is
// added to the bucket URL: status URLs carry no query parameters (they
// could hold credentials), but an S3 endpoint other than AWS needs some.
func splitObjectURL(raw, key, query string) (bucketURL, objKey string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("parsing spill URL %q: %w", raw, err)
	}
	if u.Scheme == "" {
		return "", "", fmt.Errorf("spill URL %q has no scheme", raw)
	}
	p := u.Path
	if strings.HasSuffix(p, "/"+key) {
		objKey = key
		p = strings.TrimSuffix(p, "/"+key)
	} else {
		segs := strings.Split(strings.Trim(p, "/"), "/")
		if len(segs) < 4 {
			return "", "", fmt.Errorf("spill URL %q does not end in <namespace>/<name>/<uid>/<stream>", raw)
		}
		objKey = strings.Join(segs[len(segs)-4:], "/")
		p = strings.TrimSuffix(strings.TrimSuffix(p, "/"), "/"+objKey)
	}
	u.Path, u.RawPath = p, ""
	u.RawQuery = query
	return u.String(), objKey, nil
}

// readCloser closes the object reader and then its bucket.
type readCloser struct {
	io.Reader
	closers []io.Closer
}

func (r readCloser) Close() error {
	var errs []error
	for _, c := range r.closers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// objectFetcher returns the fetchFunc for one stream of bt.
func objectFetcher(bt *bashtaskv1alpha1.BashTask, stream, query string) fetchFunc {
	return func(ctx context.Context, spill *bashtaskv1alpha1.SpillRef, offset int64) (io.ReadCloser, error) {
		bucketURL, key, err := splitObjectURL(ptr.Deref(spill.URL, ""), objectKey(bt, stream), query)
		if err != nil {
			return nil, err
		}
		b, err := blob.OpenBucket(ctx, bucketURL)
		if err != nil {
			return nil, fmt.Errorf("opening bucket %s: %w", bucketURL, err)
		}
		r, err := b.NewRangeReader(ctx, key, offset, -1, nil)
		if err != nil {
			err = fmt.Errorf("opening object %s: %w", key, err)
			if gcerrors.Code(err) == gcerrors.NotFound && strings.HasPrefix(bucketURL, "file:") {
				// The usual cause, worth saying: a file:// bucket is a
				// directory on the agent's machine.
				err = fmt.Errorf("%w (a file:// bucket is a directory on the agent's machine, readable only there)", err)
			}
			return nil, errors.Join(err, b.Close())
		}
		return readCloser{Reader: r, closers: []io.Closer{r, b}}, nil
	}
}
