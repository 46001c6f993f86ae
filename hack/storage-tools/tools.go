//go:build tools

// Package tools keeps the storage servers that the model-source tests start (hack/setup.sh step 8
// builds them into .cache/bin/) in this module's go.mod: MinIO, the S3-compatible object store, and
// go-containerregistry's crane, whose `crane registry serve` is an OCI registry and whose
// `crane append` pushes a model image to it.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
	_ "github.com/minio/minio"
)
