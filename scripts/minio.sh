# Sourced by setup.sh and test.sh: the MinIO that the tests of the S3
# backend start, built from its Go module at a pinned version into a cache
# outside the repository (docs/decisions.md, "S3 server for tests").
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
STRATA_MINIO="${XDG_CACHE_HOME:-$HOME/.cache}/strata/minio-$MINIO_VERSION/minio"
export STRATA_MINIO
