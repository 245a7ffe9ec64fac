#!/usr/bin/env bash
# make_certs.sh: every certificate verifies against its CA, carries its role (URI SAN + OU) and
# the requested SANs; a second run changes nothing; new hosts re-issue the leaves but keep the CA;
# another CA's certificates do not verify; --worker certificates name their worker.
set -euo pipefail
script="$1"
out="$TEST_TMPDIR/certs"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$script" "$out" --hosts=10.1.2.3,node-a --cert=prefill-1:prefill --api_key > /dev/null
for spec in router:router prefill:prefill decode:decode mixed:mixed admin:admin client:client \
            prefill-1:prefill; do
  name="${spec%%:*}" role="${spec#*:}"
  openssl verify -CAfile "$out/ca.pem" "$out/$name.pem" > /dev/null || fail "$name does not verify"
  text="$(openssl x509 -in "$out/$name.pem" -noout -text)"
  grep -q "URI:spiffe://tandem/role/$role" <<< "$text" || fail "$name: no role URI"
  grep -q "OU *= *$role" <<< "$text" || fail "$name: no OU=$role"
  grep -q "CN *= *$name" <<< "$text" || fail "$name: CN"
  for san in "DNS:localhost" "IP Address:127.0.0.1" "IP Address:10.1.2.3" "DNS:node-a"; do
    grep -q "$san" <<< "$text" || fail "$name: missing SAN $san"
  done
  grep -q "TLS Web Server Authentication, TLS Web Client Authentication" <<< "$text" ||
    fail "$name: extended key usage"
  grep -q "CA:FALSE" <<< "$text" || fail "$name: leaf is a CA"
  # The key is the certificate's.
  [[ "$(openssl x509 -in "$out/$name.pem" -noout -pubkey)" == \
     "$(openssl pkey -in "$out/$name.key" -pubout)" ]] || fail "$name: key mismatch"
  [[ "$(stat -c %a "$out/$name.key")" == 600 ]] || fail "$name.key is not 0600"
done
# Two keys (issue 30 item 10): the client key in api_key, the operator's (admin) in admin_api_key.
[[ $(grep -c '^tk-' "$out/api_keys") == 2 ]] || fail "api_keys: want 2 keys"
grep -q "^tk-[0-9a-f]\{48\} client$" "$out/api_keys" || fail "api_keys: no client key"
grep -q "^tk-[0-9a-f]\{48\} operator admin$" "$out/api_keys" || fail "api_keys: no operator key"
[[ "$(cat "$out/api_key")" == "$(awk '$2 == "client" && NF == 2 {print $1}' "$out/api_keys")" ]] ||
  fail "api_key is not the client (non-admin) key"
[[ "$(cat "$out/admin_api_key")" == "$(awk '$3 == "admin" {print $1}' "$out/api_keys")" ]] ||
  fail "admin_api_key is not the admin key"
[[ "$(cat "$out/api_key")" != "$(cat "$out/admin_api_key")" ]] || fail "one key for both"
for f in api_keys api_key admin_api_key; do
  [[ "$(stat -c %a "$out/$f")" == 600 ]] || fail "$f is not 0600"
done

# Idempotent: a second run prints nothing and changes no file.
before="$(cd "$out" && sha256sum ./*)"
[[ -z "$("$script" "$out" --hosts=10.1.2.3,node-a --cert=prefill-1:prefill --api_key)" ]] ||
  fail "second run re-issued something"
[[ "$(cd "$out" && sha256sum ./*)" == "$before" ]] || fail "second run changed files"

# New hosts: leaves re-issued with them, the CA kept (old leaves' peers still trust it).
ca_before="$(sha256sum < "$out/ca.pem")"
"$script" "$out" --hosts=10.9.9.9 > /dev/null
[[ "$(sha256sum < "$out/ca.pem")" == "$ca_before" ]] || fail "CA changed"
openssl x509 -in "$out/router.pem" -noout -text | grep -q "IP Address:10.9.9.9" ||
  fail "router not re-issued for the new host"
openssl verify -CAfile "$out/ca.pem" "$out/router.pem" > /dev/null || fail "re-issued router"

# Another CA's certificates are not ours.
"$script" "$TEST_TMPDIR/other" > /dev/null
if openssl verify -CAfile "$out/ca.pem" "$TEST_TMPDIR/other/router.pem" > /dev/null 2>&1; then
  fail "a certificate from another CA verifies"
fi
# A worker daemon's certificate: the URI names role and worker, CN the worker.
"$script" "$out" --worker=decode-3:decode > /dev/null
text="$(openssl x509 -in "$out/decode-3.pem" -noout -text)"
grep -q "URI:spiffe://tandem/role/decode/worker/decode-3," <<< "$text" || fail "decode-3: worker URI"
grep -q "OU *= *decode" <<< "$text" || fail "decode-3: no OU=decode"
openssl verify -CAfile "$out/ca.pem" "$out/decode-3.pem" > /dev/null || fail "decode-3 does not verify"
[[ -z "$("$script" "$out" --worker=decode-3:decode)" ]] || fail "worker certificate re-issued"
# The same name as a role-only certificate is re-issued without the worker part.
"$script" "$out" --cert=decode-3:decode > /dev/null
openssl x509 -in "$out/decode-3.pem" -noout -text | grep -q "/worker/" && fail "--cert kept worker URI"
# A directory from before the split (one admin key that every client held): both keys anew.
old_dir="$TEST_TMPDIR/old-keys"
"$script" "$old_dir" > /dev/null
printf '# key name [admin]\ntk-0123 local admin\n' > "$old_dir/api_keys"
echo tk-0123 > "$old_dir/api_key"
"$script" "$old_dir" --api_key > /dev/null
grep -q tk-0123 "$old_dir/api_keys" "$old_dir/api_key" "$old_dir/admin_api_key" && fail "old admin key kept"
grep -q "^$(cat "$old_dir/api_key") client$" "$old_dir/api_keys" || fail "upgrade: no client key"
# Bad arguments are refused.
if "$script" "$out" --worker=r:router > /dev/null 2>&1; then fail "worker certificate of role router"; fi
if "$script" "$out" --worker='a/b:decode' > /dev/null 2>&1; then fail "bad worker id accepted"; fi
if "$script" "$out" --cert=x:root > /dev/null 2>&1; then fail "unknown role accepted"; fi
if "$script" "$out" --days=1 > /dev/null 2>&1; then fail "--days=1 accepted"; fi
echo PASS
