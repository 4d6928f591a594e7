#!/usr/bin/env python3
"""Regenerates the conformance suite's test data from the upstream sources.

Usage: conformance-vectors.py WYCHEPROOF CCTV SPECCHECK BLAKE3 COSE CBOR
where each argument is a git directory (a clone, or a bare repository) of,
in order: github.com/C2SP/wycheproof, github.com/C2SP/CCTV,
github.com/novifinancial/ed25519-speccheck, github.com/BLAKE3-team/BLAKE3,
github.com/cose-wg/Examples, github.com/cbor/test-vectors. Files are read at
HEAD with `git show`; the commits used are recorded in each testdata
README.md. The output keeps only the fields the tests read, as compact JSON,
so the suite stays small; the vectors themselves are not changed.
"""
import gzip, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def show(repo, path):
    return subprocess.run(["git", "--git-dir", repo, "show", "HEAD:" + path],
                          check=True, capture_output=True).stdout


def write(rel, data):
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=False) + "\n"


def wycheproof(repo, name, group_keys, test_keys, keep_group=lambda g: True):
    d = json.loads(show(repo, "testvectors_v1/" + name))
    out = {"algorithm": d["algorithm"], "source": "C2SP/wycheproof testvectors_v1/" + name,
           "numberOfTests": d["numberOfTests"], "testGroups": []}
    for g in d["testGroups"]:
        if not keep_group(g):
            continue
        og = {k: g[k] for k in group_keys if k in g}
        og["tests"] = [{k: t[k] for k in test_keys if k in t} for t in g["tests"]]
        out["testGroups"].append(og)
    return compact(out)


def main():
    wy, cctv, spec, b3, cose, cbor = sys.argv[1:7]
    sign = "crypto/sign/testdata/conformance/"
    rat = "crypto/ratchet/testdata/conformance/"
    # Only the raw key of each group is read: its DER, PEM and JWK forms go.
    d = json.loads(wycheproof(wy, "ed25519_test.json", ["publicKey"],
                              ["tcId", "comment", "flags", "msg", "sig", "result"]))
    for g in d["testGroups"]:
        g["publicKey"] = {"pk": g["publicKey"]["pk"]}
    write(sign + "wycheproof_ed25519.json", compact(d))
    write(sign + "cctv_ed25519vectors.json", compact(json.loads(show(cctv, "ed25519/ed25519vectors.json"))))
    write(sign + "speccheck_cases.json", compact(json.loads(show(spec, "cases.json"))))
    for p in ["eddsa-examples/eddsa-sig-01.json", "eddsa-examples/eddsa-sig-02.json",
              "sign1-tests/sign-pass-01.json", "sign1-tests/sign-pass-02.json", "sign1-tests/sign-pass-03.json",
              "sign1-tests/sign-fail-01.json", "sign1-tests/sign-fail-02.json", "sign1-tests/sign-fail-03.json",
              "sign1-tests/sign-fail-04.json", "sign1-tests/sign-fail-06.json", "sign1-tests/sign-fail-07.json"]:
        write(sign + "cose/" + os.path.basename(p), compact(json.loads(show(cose, p))))

    write(rat + "wycheproof_x25519.json", wycheproof(
        wy, "x25519_test.json", ["curve"], ["tcId", "comment", "flags", "public", "private", "shared", "result"]))
    write(rat + "wycheproof_hmac_sha256.json", wycheproof(
        wy, "hmac_sha256_test.json", ["keySize", "tagSize"], ["tcId", "comment", "flags", "key", "msg", "tag", "result"]))
    write(rat + "wycheproof_hkdf_sha256.json", wycheproof(
        wy, "hkdf_sha256_test.json", ["keySize"], ["tcId", "comment", "flags", "ikm", "salt", "info", "size", "okm", "result"]))
    write(rat + "wycheproof_mlkem_768.json", wycheproof(
        wy, "mlkem_768_test.json", ["parameterSet"], ["tcId", "flags", "seed", "ek", "c", "K", "result"]))
    write(rat + "cctv_mlkem768_modulus.txt.gz", show(cctv, "ML-KEM/modulus/ML-KEM-768.txt.gz"))

    # The storage sealer is AES-256-GCM with 96-bit nonces and 128-bit tags:
    # only those groups can be expressed through it.
    write("crypto/sealed/testdata/conformance/wycheproof_aes_gcm.json", wycheproof(
        wy, "aes_gcm_test.json", ["keySize", "ivSize", "tagSize"],
        ["tcId", "comment", "flags", "key", "iv", "aad", "msg", "ct", "tag", "result"],
        keep_group=lambda g: g["keySize"] == 256 and g["ivSize"] == 96 and g["tagSize"] == 128))

    write("crypto/eventid/testdata/conformance/blake3_test_vectors.json",
          compact(json.loads(show(b3, "test_vectors/test_vectors.json"))))
    write("messages/testdata/conformance/cbor_appendix_a.json",
          compact(json.loads(show(cbor, "appendix_a.json"))))


if __name__ == "__main__":
    main()
