#!/usr/bin/env bash
# Bazel wrapper of validate.sh (//deploy/k8s:k8s_validate_test): the binaries come from the
# runfiles; kubectl and kubernetes-validate are NOT installed here (the test runner installs
# them, see README.md): a missing one fails with the command that installs it.
#
#   validate_test.sh   (cwd: the runfiles root, which has runtime/tandem_worker,
#                       router/tandem_router, router/tandem_cli, deploy/k8s/...)
set -euo pipefail
RUNFILES=$PWD
# Bazel points HOME at the test's temporary directory; the tool caches live in the real one.
REAL_HOME=$(getent passwd "$(id -un)" | cut -d: -f6)
export HOME=${REAL_HOME:-$HOME}
export TANDEM_K8S_NO_INSTALL=1
# kustomize refuses resources that resolve (symlinks) outside the kustomization directory, and
# runfiles are symlinks into the source tree: validate a dereferenced copy.
COPY=${TEST_TMPDIR:-$(mktemp -d)}/k8s
rm -rf "$COPY" && mkdir -p "$COPY/deploy"
cp -rL "$RUNFILES/deploy/k8s" "$COPY/deploy/k8s"
cp -rL "$RUNFILES/deploy/certs" "$COPY/deploy/certs"   # make_secrets.sh runs make_certs.sh
TANDEM_REPO_ROOT=$RUNFILES exec "$COPY/deploy/k8s/validate.sh" "$RUNFILES"
