"""Pod Security Standards "restricted" (and the "baseline" it includes) as a checker of pod specs.

Written from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (policy
version latest); the same checks the PodSecurity admission controller runs for a namespace
labelled pod-security.kubernetes.io/enforce=restricted. Returns the violations, one line each.
"""
from __future__ import annotations

from typing import Any

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SECCOMP_OK = {"RuntimeDefault", "Localhost"}


def pod_spec(obj: dict) -> dict | None:
    """The pod spec of a Pod or of a workload's pod template (None for other kinds)."""
    if obj.get("kind") == "Pod":
        return obj.get("spec", {})
    if obj.get("kind") == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    template = obj.get("spec", {}).get("template")
    return template.get("spec") if isinstance(template, dict) else None


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    psc = spec.get("securityContext") or {}
    out = _pod_violations(spec, psc)
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    containers = [("container", c) for c in spec.get("containers") or []]
    containers += [("initContainer", c) for c in spec.get("initContainers") or []]
    containers += [("ephemeralContainer", c) for c in spec.get("ephemeralContainers") or []]
    for kind, c in containers:
        out += _container_violations(f"{kind} {c.get('name')}", c, psc, pod_seccomp)
    return out


def _pod_violations(spec: dict[str, Any], psc: dict[str, Any]) -> list[str]:
    """The pod-level checks: host namespaces, volume types, sysctls, user, SELinux, seccomp."""
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"pod: {key} must not be true")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')}: type {', '.join(sorted(kinds))} not allowed")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {s.get('name')} not allowed")
    if psc.get("runAsUser") == 0:
        out.append("pod: runAsUser must not be 0")
    out += _selinux("pod", psc)
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_OK:
        out.append(f"pod: seccompProfile {pod_seccomp} not allowed")
    return out


def _container_violations(where: str, c: dict[str, Any], psc: dict[str, Any], pod_seccomp: str | None) -> list[str]:
    """One container's checks; runAsNonRoot and seccompProfile may come from the pod."""
    out: list[str] = []
    sc = c.get("securityContext") or {}
    if sc.get("privileged"):
        out.append(f"{where}: privileged must not be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation must be false")
    non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    if non_root is not True:
        out.append(f"{where}: runAsNonRoot must be true (container or pod)")
    if sc.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser must not be 0")
    seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
    if seccomp not in SECCOMP_OK:
        out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost (container or pod)")
    out += _capability_violations(where, sc.get("capabilities") or {})
    for p in c.get("ports") or []:
        if p.get("hostPort"):
            out.append(f"{where}: hostPort {p['hostPort']} not allowed")
    if sc.get("procMount", "Default") != "Default":
        out.append(f"{where}: procMount must be Default")
    out += _selinux(where, sc)
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"{where}: appArmorProfile {apparmor} not allowed")
    return out


def _capability_violations(where: str, caps: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}: capabilities.drop must include ALL")
    added = set(caps.get("add") or [])
    if added - {"NET_BIND_SERVICE"}:
        out.append(f"{where}: capabilities.add {sorted(added - {'NET_BIND_SERVICE'})} not allowed")
    if added - BASELINE_CAPABILITIES:   # also fails baseline
        out.append(f"{where}: capabilities.add beyond baseline")
    return out


def _selinux(where: str, sc: dict) -> list[str]:
    opts = sc.get("seLinuxOptions") or {}
    out = []
    if opts.get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
        out.append(f"{where}: seLinuxOptions.type {opts['type']} not allowed")
    if opts.get("user") or opts.get("role"):
        out.append(f"{where}: seLinuxOptions.user / role must not be set")
    return out
