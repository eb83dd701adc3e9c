"""One container under the pod runner (tests/pod_runner.py), as a container runtime lays it out: the shell
script that, in the container's own mount namespace, builds its root filesystem, mounts its volumes and
execs its command as its user with its capabilities.

- The image: this machine's root filesystem as the lowest layer (the checkout and its venvs stand in for
  LPX installed in the image), with the image's extra layers over it (.tools/mpi: Debian's Open MPI and
  OpenSSH, unpacked as apt lays them out, so /usr/sbin/sshd and /usr/bin/mpirun are where the image has
  them) and a writable layer on top: an overlay mount. The layers are copied into a tmpfs first: overlayfs
  refuses a lower layer inside another (the checkout lies under /).
- Python: the checkout's venvs point at an interpreter that may lie under a folder other users cannot
  enter (/root, mode 700, on a developer machine); in an image it is readable by every user. A folder the
  container's user could not search is replaced by an empty tmpfs (mode 755) holding only the
  interpreter's prefix, bound read-only; nothing else of it is visible.
- /dev, /proc, /sys from this machine; the pod's /etc/hosts, /etc/hostname, /etc/resolv.conf bound over
  the image's, as the kubelet does; uid 1000 given a passwd entry where this machine has none (the images
  create one).
- Volumes bound at their mountPath (read-only ones remounted read-only); mount points are made in the
  writable layer, so nothing is created on this machine's root filesystem.
- readOnlyRootFilesystem: the overlay remounted read-only once everything is mounted, so the container
  writes only where a volume is mounted.
- The user and capabilities: runAsUser / runAsGroup / fsGroup / supplementalGroups through setpriv;
  the bounding set is the runtime's default (containerd's) minus capabilities.drop ("ALL": none) plus
  capabilities.add; allowPrivilegeEscalation false sets no_new_privs. A process that changes to a non-root
  uid keeps no capability, so a non-root container has none. seccompProfile is not applied.
"""

from __future__ import annotations

import pwd
import shlex
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# containerd's default capabilities for a container (oci/spec.go defaultUnixCaps; Docker's are the same)
DEFAULT_CAPS = (
    "chown dac_override fsetid fowner mknod net_raw setgid setuid setfcap setpcap net_bind_service "
    "sys_chroot kill audit_write"
).split()
IMAGE_USER = "lpx"  # the name the images give uid 1000 when their base has none (Dockerfile*)


class ContainerFailure(AssertionError):
    pass


def interpreter_prefixes() -> list[Path]:
    """The Python installations the checkout's venvs run on (the image's interpreter)."""
    prefixes = {Path(sys.base_prefix).resolve()}
    for cfg in ROOT.glob(".venv*/pyvenv.cfg"):
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                prefixes.add(Path(value.strip()).resolve().parent)
    return sorted(prefixes)


def hidden_by(path: Path) -> Path | None:
    """The outermost folder above `path` that other users cannot search (mode without o+x), if any."""
    for parent in reversed(path.parents[:-1]):  # from the top down, without / itself
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


def capabilities(sc: dict) -> str:
    caps = sc.get("capabilities", {})
    drop = {c.lower().removeprefix("cap_") for c in caps.get("drop", [])}
    keep = [] if "all" in drop else [c for c in DEFAULT_CAPS if c not in drop]
    keep += [c.lower().removeprefix("cap_") for c in caps.get("add", [])]
    return ",".join(["-all", *(f"+{c}" for c in dict.fromkeys(keep))])


def user_args(sc: dict, fs_group: int | None, groups: list[int]) -> list[str]:
    """setpriv's arguments for the container's securityContext (merged with the pod's)."""
    args = ["/usr/bin/setpriv", "--bounding-set", capabilities(sc)]
    if sc.get("allowPrivilegeEscalation") is False:
        args.append("--no-new-privs")
    if "runAsUser" in sc:
        if sc["runAsUser"] == 0 and sc.get("runAsNonRoot"):
            raise ContainerFailure("runAsNonRoot with runAsUser 0: the kubelet refuses to start it")
        extra = [g for g in [fs_group, *groups] if g is not None]
        args += ["--reuid", str(sc["runAsUser"]), "--regid", str(sc.get("runAsGroup", 0))]
        args += ["--groups", ",".join(map(str, extra))] if extra else ["--clear-groups"]
    elif sc.get("runAsNonRoot"):
        raise ContainerFailure("runAsNonRoot without runAsUser: the runner cannot read the image's USER")
    return args


def image_user(uid: int) -> list[str]:
    """The passwd and group entries the image has for its user, where this machine has none."""
    try:
        pwd.getpwuid(uid)
        return []
    except KeyError:
        entry = f"{IMAGE_USER}:x:{uid}:{uid}::/home/{IMAGE_USER}:/bin/sh"
        return [
            f'echo {shlex.quote(entry)} >> "$R/etc/passwd"',
            f'echo {shlex.quote(f"{IMAGE_USER}:x:{uid}:")} >> "$R/etc/group"',
            f'mkdir -p "$R/home/{IMAGE_USER}" && chown {uid}:{uid} "$R/home/{IMAGE_USER}"',
        ]


def root_layers(base: Path, layers: list[Path]) -> list[str]:
    """The overlay of the image's layers over this machine's root, at $R, with /dev /proc /sys."""
    q = shlex.quote
    lines = [f"B={q(str(base))}", 'mount -t tmpfs -o mode=755 lpx-image "$B"']
    lines.append('mkdir "$B/layer" "$B/upper" "$B/work" "$B/root" && R="$B/root"')
    lines += [f'cp -a {q(str(layer))}/. "$B/layer/"' for layer in layers]
    lower = '"$B/layer":/' if layers else "/"
    lines.append(f'mount -t overlay lpx-root -o lowerdir={lower},upperdir="$B/upper",workdir="$B/work" "$R"')
    lines += [f'mount --rbind /{d} "$R/{d}"' for d in ("dev", "proc", "sys")]
    return lines


def visible(paths: list[Path], mounted: list[str]) -> list[str]:
    """Bind each path (the checkout, the interpreters) read-only where a volume covers it or a folder the
    user cannot search hides it."""
    lines, shaded = [], set()
    for p in paths:
        hider = hidden_by(p)
        covered = any(p.is_relative_to(dst) for dst in mounted)
        if hider is None and not covered:
            continue
        if hider is not None and hider not in shaded:
            shaded.add(hider)
            lines.append(f'mount -t tmpfs -o mode=755 lpx-image "$R"{shlex.quote(str(hider))}')
        target = '"$R"' + shlex.quote(str(p))
        lines += [f"mkdir -p {target}", f"mount --rbind {shlex.quote(str(p))} {target}"]
        lines.append(f"mount -o remount,bind,ro {target}")
    lines += [f'mount -o remount,ro "$R"{shlex.quote(str(h))}' for h in sorted(shaded)]
    return lines


def script(
    base: Path,
    layers: list[Path],
    mounts: list[tuple[Path, str, bool]],
    etc: dict[str, Path],
    sc: dict,
    user: list[str],
    env: dict[str, str],
    command: list[str],
    workdir: str = "/",
) -> str:
    """The container's start: its root ($R), volumes (source, mountPath, read-only), /etc files, and
    `exec chroot $R setpriv ... env -i ENV command`."""
    q = shlex.quote
    lines = ["set -e", *root_layers(base, layers)]
    if "runAsUser" in sc:
        lines += image_user(sc["runAsUser"])
    for src, dst, read_only in sorted(mounts, key=lambda m: len(Path(m[1]).parts)):  # parents first
        lines += [f'mkdir -p "$R"{q(dst)}', f'mount --bind {q(str(src))} "$R"{q(dst)}']
        if read_only:
            lines.append(f'mount -o remount,bind,ro "$R"{q(dst)}')
    lines += visible([ROOT, *interpreter_prefixes()], [m[1] for m in mounts])
    for name, src in etc.items():
        lines += [
            f'[ -e "$R/etc/{name}" ] || touch "$R/etc/{name}"',
            f'mount --bind {q(str(src))} "$R/etc/{name}"',
        ]
    if sc.get("readOnlyRootFilesystem"):
        lines.append('mount -o remount,ro "$R"')
    argv = [*user, "/usr/bin/env", "-i", "-C", workdir, *(f"{k}={v}" for k, v in env.items()), *command]
    lines.append('exec chroot "$R" ' + shlex.join(argv))
    return "\n".join(lines)
