package client

import (
	"context"
	"fmt"

	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// GetTask reads a BashTask (RBAC: get on bashtasks).
func (c *Client) GetTask(ctx context.Context, namespace, name string) (*bashtaskv1alpha1.BashTask, error) {
	var t bashtaskv1alpha1.BashTask
	if err := c.k8s.Get(ctx, ctrlclient.ObjectKey{Namespace: namespace, Name: name}, &t); err != nil {
		return nil, fmt.Errorf("reading BashTask %s/%s: %w", namespace, name, err)
	}
	return &t, nil
}
