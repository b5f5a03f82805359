package mcpserver

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// explain adds to an API error what a model can do about it. The error is
// returned to the client as a tool error (isError), never as a failure of
// the server.
func explain(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w (the caller's identity may not do this: RBAC refused it; ask an administrator for a Role, or use a workspace of your own namespace)", err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w (the API server did not accept the credentials)", err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w (check the name; workspace_create makes a workspace)", err)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w (choose another name, or use the existing one)", err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (it took too long; try again, or with a larger timeout)", err)
	}
	return err
}
