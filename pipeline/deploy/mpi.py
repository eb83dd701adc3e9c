"""Multi-node engines (LeaderWorkerSet): how the leader's mpirun starts ranks on the worker pods.

The workers run OpenSSH's sshd as the images' non-root user (uid 1000) on port 2222, with a read-only
root filesystem and no capabilities: sshd runs unprivileged (no privilege separation user, no chroot;
it can log in only its own user, the one mpirun needs). Everything it writes goes to LPX_HOME (an
emptyDir): its config, a 0600 copy of the host key and authorized keys from the Secret
`deploy.ssh_secret` (files host_key, authorized_keys, id_ed25519, known_hosts), and one `SetEnv` line
(sshd ignores every SetEnv line after the first) that gives remote ranks the container's environment (PATH, LD_LIBRARY_PATH, CUDA/NCCL/UCX/OMPI settings:
what `mpirun -x` would forward); and LPX_HOME/logs, where the worker's ranks log (`--log-file`).

The leader's ssh uses the same Secret through Open MPI's OMPI_MCA_plm_rsh_args (key, port, known_hosts;
strict host-key checking, no password prompt): this env is the only place for ssh's options, since Open
MPI takes a command-line `--mca plm_rsh_args` over it (servers/ranks.py sets none). And
OMPI_MCA_orte_keep_fqdn_hostnames=1: by default Open MPI 4 cuts a host name at its first dot and ssh is
given `<lws>-<group>-1`, which no cluster DNS record carries (the headless Service's records are
<pod>.<lws>.<namespace>.svc...); tests/test_pods_mpi.py ran into exactly that. NVIDIA Dynamo's operator sets
the same variable for multi-node TensorRT-LLM (ai-dynamo/dynamo deploy/operator/internal/dynamo/
backend_trtllm.go at 015d780ba9c3d32c293ad67b786fe9af0d8a4d22, read 2026-12-07).

The Secret (docs/deploy.md, "Multi-node engines"):

    ssh-keygen -t ed25519 -N '' -f host_key; ssh-keygen -t ed25519 -N '' -f id_ed25519
    cp id_ed25519.pub authorized_keys; echo "* $(cat host_key.pub)" > known_hosts
    kubectl -n lpx create secret generic lpx-mpi-ssh --from-file=host_key --from-file=authorized_keys \\
      --from-file=id_ed25519 --from-file=known_hosts
"""

from __future__ import annotations

SSH_PORT = 2222
SSH_MOUNT = "/etc/lpx/ssh"
STATE = "$LPX_HOME/sshd"
FORWARDED = (
    "PATH|LD_LIBRARY_PATH|LPX_HOME|HOME|CUDA_[A-Z_]*|NCCL_[A-Z_]*|UCX_[A-Z_]*|OMPI_[A-Z_]*|NVIDIA_[A-Z_]*"
)

# POSIX sh: run in the worker container before `exec sshd`
SETUP = f"""set -eu
d="{STATE}"
mkdir -p "$d" "$LPX_HOME/logs"
umask 077
cp {SSH_MOUNT}/host_key "$d/host_key"
cp {SSH_MOUNT}/authorized_keys "$d/authorized_keys"
chmod 600 "$d/host_key" "$d/authorized_keys"
{{
  echo "Port {SSH_PORT}"
  echo "HostKey $d/host_key"
  echo "AuthorizedKeysFile $d/authorized_keys"
  echo "PidFile none"
  echo "PasswordAuthentication no"
  echo "KbdInteractiveAuthentication no"
  echo "PubkeyAuthentication yes"
  echo "StrictModes no"
  echo "UsePAM no"
  # one SetEnv line: sshd uses only the first (servconf.c, case sSetEnv: first match wins); each
  # NAME=VALUE quoted, with its backslashes and quotes escaped
  printf SetEnv
  env | grep -E '^({FORWARDED})=' | sed 's/\\\\/\\\\\\\\/g; s/"/\\\\"/g; s/^.*$/ "&"/' | tr -d '\\n'
  echo
}} > "$d/sshd_config"
"""
SSHD = 'exec /usr/sbin/sshd -D -e -f "$LPX_HOME/sshd/sshd_config"'

# the leader's ssh (Open MPI reads MCA parameters from OMPI_MCA_* variables)
RSH_ARGS = (
    f"-p {SSH_PORT} -i {SSH_MOUNT}/id_ed25519 -o StrictHostKeyChecking=yes "
    f"-o UserKnownHostsFile={SSH_MOUNT}/known_hosts -o BatchMode=yes"
)


def worker_command() -> list[str]:
    return ["sh", "-c", SETUP + SSHD]


SECRET_KEYS = ("host_key", "authorized_keys", "id_ed25519", "known_hosts")


def leader_env() -> list[dict[str, str]]:
    return [
        {"name": "OMPI_MCA_plm_rsh_args", "value": RSH_ARGS},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"},
    ]


def secret_command(namespace: str, secret: str) -> str:
    """The commands that make the Secret `secret` (docs/deploy.md)."""
    files = " ".join(f"--from-file={k}" for k in SECRET_KEYS)
    return (
        "ssh-keygen -t ed25519 -N '' -f host_key && ssh-keygen -t ed25519 -N '' -f id_ed25519 && "
        'cp id_ed25519.pub authorized_keys && echo "* $(cat host_key.pub)" > known_hosts && '
        f"kubectl -n {namespace} create secret generic {secret} {files}"
    )


def ssh_volume(secret: str) -> dict:
    return {"name": "ssh", "secret": {"secretName": secret, "defaultMode": 0o400}}
