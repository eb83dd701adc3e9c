"""Multi-node engines (LeaderWorkerSet): how the leader's mpirun starts ranks on the worker pods.

The workers run OpenSSH's sshd as the images' non-root user (uid 1000) on port 2222, with a read-only
root filesystem and no capabilities: sshd runs unprivileged (no privilege separation user, no chroot;
it can log in only its own user, the one mpirun needs). Everything it writes goes to LPX_HOME (an
emptyDir): its config, a 0600 copy of the host key and authorized keys from the Secret
`deploy.ssh_secret` (files host_key, authorized_keys, id_ed25519, known_hosts), and `SetEnv` lines that
give remote ranks the container's environment (PATH, LD_LIBRARY_PATH, CUDA/NCCL/UCX/OMPI settings:
what `mpirun -x` would forward). The leader's ssh uses the same Secret through Open MPI's
OMPI_MCA_plm_rsh_args (key, port, known_hosts; strict host-key checking).

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
mkdir -p "$d"
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
  env | grep -E '^({FORWARDED})=' | sed 's/"/\\\\"/g; s/^\\([^=]*\\)=\\(.*\\)$/SetEnv \\1="\\2"/'
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


def leader_env() -> list[dict[str, str]]:
    return [{"name": "OMPI_MCA_plm_rsh_args", "value": RSH_ARGS}]


def ssh_volume(secret: str) -> dict:
    return {"name": "ssh", "secret": {"secretName": secret, "defaultMode": 0o400}}
