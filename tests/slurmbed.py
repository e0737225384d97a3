"""A real Slurm on a test bed (tests/testbed.py): Debian's slurmctld and slurmd, and munge.

On a started ``TestBed`` of N hosts, ``SlurmBed(bed).up()`` starts

* one ``munged`` (its own key, socket, log and seed under ``<root>/slurm/munge``), which serves
  every host: a Unix socket path is reached from any network namespace; ``AuthInfo=socket=``
  in slurm.conf points every Slurm daemon and command at it;
* ``slurmctld`` in h1's network and UTS namespaces, and one ``slurmd`` in each host's network,
  UTS, mount and PID namespaces (node name: the host's hostname, ``tb<K>-h<i>``), as on a real
  node: the processes of a Slurm job live beside the host's sshd and rigdeck agent, see its
  ``~/.rigdeck`` and its processes (a job launched through Slurm is supervised by the host's
  agent). A bed host's mount namespace comes from ``ip netns exec``, whose ``/sys`` is the
  network namespace's sysfs without cgroup mounts, which slurmd reads at start: this machine's
  cgroup mounts are made again there first (``_mount_cgroups``). Spool, pid and log paths carry
  ``%n`` (one file per node); Slurm's processes are found by network namespace, as the bed's
  own teardown finds every process of a host;
* each host's simulated GPUs as GRES ``gpu``, backed by dummy character devices the bed creates
  (``<root>/slurm/dev/nvidia<i>``), so that Slurm sets ``CUDA_VISIBLE_DEVICES`` and
  ``SLURM_JOB_GPUS`` as on a real node. The GPUs are simulated (no driver is behind the files).

Each host sees the bed's Slurm configuration at ``/etc/slurm`` (a bind mount in its own mount
namespace), as a node of a real cluster does: ``sbatch``, ``squeue`` and ``scontrol`` run on a
host (``SlurmBed.run``), or the agent's ``scontrol``, need no ``SLURM_CONF``.

Plugins that need neither cgroups nor systemd: ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none``; ``SlurmdParameters=config_overrides`` lets each node claim the CPUs
and memory the configuration gives it whatever this machine has.

``SlurmBed(bed, accounting=True)`` adds Slurm's accounting, as most sites run it: a MariaDB
(Debian's ``mariadb-server``: its own data directory, ``mariadb-install-db``, listening on
127.0.0.1 in h1's network namespace only) and ``slurmdbd`` (Debian's) on h1, the cluster added
with ``sacctmgr``, ``AccountingStorageTRES=gres/gpu`` so that each job's GPUs are kept; ``sacct``
then answers on every host. Without it there is no accounting database (``sacct`` says
accounting storage is disabled).

``down()`` stops everything it started and removes its files; the bed's own teardown (which
kills every process of each host's network namespace and removes ``<root>``) would as well.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.testbed import TestBed, TestBedError, TestHost, _netns_pids

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
SLURMDBD = "/usr/sbin/slurmdbd"
MARIADBD = "/usr/sbin/mariadbd"
MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADB = "/usr/bin/mariadb"
DB_PORT = 3306  # in h1's network namespace, on 127.0.0.1 only
ETC_SLURM = "/etc/slurm"
CGROUP_ROOT = "/sys/fs/cgroup"
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
NODE_CPUS = 8  # what each node claims (config_overrides): jobs of a few tasks fit on 2 cores
START_TIMEOUT = 30.0
# A second Unix user for jobs that are not root's: every Debian system has nobody.
OTHER_USER = "nobody"
OTHER_GROUP = "nogroup"


def accounting_available() -> tuple[bool, str]:
    """(True, "") when Debian's slurmdbd and MariaDB are installed here, else (False, what is missing)."""
    missing = [p for p in (SLURMDBD, MARIADBD, MARIADB_INSTALL_DB, MARIADB) if not os.access(p, os.X_OK)]
    if missing:
        return False, f"{', '.join(missing)} not found: apt-get install slurmdbd mariadb-server (make test does)"
    return True, ""


def available() -> tuple[bool, str]:
    """(True, "") when Debian's Slurm and munge are installed here, else (False, what is missing)."""
    missing = [p for p in (SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    if missing:
        return False, f"{', '.join(missing)} not found: apt-get install slurm-wlm (make test does)"
    if not os.access(MUNGED, os.X_OK):
        return False, f"{MUNGED} not found: apt-get install munge (make test does)"
    for tool in CLIENTS:
        if not shutil.which(tool):
            return False, f"{tool} not found: apt-get install slurm-client (make test does)"
    return True, ""


class SlurmBed:
    """Slurm on every host of ``bed``, each host's ``bed.sim_gpus`` simulated GPUs as GRES."""

    __test__ = False

    def __init__(self, bed: TestBed, start_timeout: float = START_TIMEOUT, accounting: bool = False) -> None:
        if not bed.hosts:
            raise TestBedError("the test bed is not up")
        self.bed = bed
        self.gpus = bed.sim_gpus
        self.start_timeout = start_timeout
        self.dir = bed.root / "slurm"
        self.etc = self.dir / "etc"
        self.conf = self.etc / "slurm.conf"
        self.munge_dir = self.dir / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self.out = self.dir / "out"  # jobs' output files (world-writable, sticky)
        self.cluster = f"rdk{bed.k}"
        self.accounting = accounting
        self._procs: list[subprocess.Popen[bytes]] = []

    # ---- names

    def node(self, host: int | str | TestHost) -> str:
        """The Slurm node name of a bed host (its hostname)."""
        return self.bed.host(host).hostname

    @property
    def nodes(self) -> list[str]:
        return [h.hostname for h in self.bed.hosts]

    # ---- starting

    def up(self) -> SlurmBed:
        ok, why = available()
        if not ok:
            raise TestBedError(f"Slurm unavailable: {why}")
        try:
            self._write_files()
            self._start_munged()
            self._mount_etc()
            ctld = self.bed.hosts[0]
            if self.accounting:
                self._start_accounting(ctld)
            self._spawn(ctld, "slurmctld", [SLURMCTLD, "-D", "-i"])
            for h in self.bed.hosts:
                self._mount_cgroups(h)
                self._spawn(h, f"slurmd-{h.hostname}", [SLURMD, "-D", "-N", h.hostname], whole=True)
            self.wait_idle(self.start_timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _write_files(self) -> None:
        for d in (self.dir, self.etc, self.dir / "ctld", self.dir / "spool", self.dir / "log",
                  self.dir / "run", self.dir / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(exist_ok=True)
        self.out.chmod(0o1777)
        for i in range(self.gpus):
            dev = self.dir / "dev" / f"nvidia{i}"
            if not dev.exists():  # a character device no driver answers: a simulated GPU's node
                os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(195, i))
        for h in self.bed.hosts:
            (self.dir / "spool" / h.hostname).mkdir(exist_ok=True)
        self.conf.write_text(self._slurm_conf())
        (self.etc / "gres.conf").write_text(self._gres_conf())
        (self.etc / "cgroup.conf").write_text("# rigdeck test bed: no cgroup plugin is used\n")

    def _slurm_conf(self) -> str:
        d = self.dir
        ctld = self.bed.hosts[0]
        lines = [
            f"# rigdeck test bed {self.bed.k}: a real Slurm, simulated GPUs (tests/slurmbed.py)",
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={ctld.hostname}({ctld.address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'ctld'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *(["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={ctld.address}",
               "AccountingStorageTRES=gres/gpu",
               # the munge socket Slurm's daemons and commands authenticate to slurmdbd with
               f"AccountingStoragePass={self.socket}"] if self.accounting else
              ["AccountingStorageType=accounting_storage/none"]),
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=2",
            "Waittime=0",
        ]
        for h in self.bed.hosts:
            gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
            lines.append(f"NodeName={h.hostname} NodeAddr={h.address} CPUs={NODE_CPUS} "
                         f"RealMemory=4000{gres} State=UNKNOWN")
        names = ",".join(self.nodes)
        lines.append(f"PartitionName=bed Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _gres_conf(self) -> str:
        if not self.gpus:
            return "# no GPUs on this bed\n"
        files = f"{self.dir / 'dev'}/nvidia[0-{self.gpus - 1}]" if self.gpus > 1 else f"{self.dir / 'dev'}/nvidia0"
        return f"NodeName={','.join(self.nodes)} Name=gpu File={files}\n"

    def _start_munged(self) -> None:
        m = self.munge_dir
        m.mkdir(mode=0o755, exist_ok=True)  # every user's commands reach the socket
        key = m / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        h = self.bed.hosts[0]
        # In h1's network namespace: the bed's teardown takes it with the host.
        argv = ["nsenter", f"--net=/run/netns/{h.netns}", "--", MUNGED, "--foreground", "--force",
                f"--key-file={key}", f"--socket={self.socket}", f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"]
        self._popen(argv, m / "munged.out")
        deadline = time.monotonic() + self.start_timeout
        while not self.socket.exists():
            if self._procs[-1].poll() is not None or time.monotonic() > deadline:
                raise TestBedError(f"munged did not start: {self._tail(m / 'munged.out')} "
                                   f"{self._tail(m / 'munged.log')}")
            time.sleep(0.02)

    def _start_accounting(self, h: TestHost) -> None:
        """MariaDB and slurmdbd on ``h`` (its network namespace), and the cluster in the database."""
        ok, why = accounting_available()
        if not ok:
            raise TestBedError(f"Slurm's accounting unavailable: {why}")
        db = self.dir / "db"
        db.mkdir(exist_ok=True)
        cp = subprocess.run([MARIADB_INSTALL_DB, "--no-defaults", "--user=root", f"--datadir={db / 'data'}",
                             "--auth-root-authentication-method=socket", "--skip-test-db"],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, env=self._env())
        if cp.returncode != 0:
            raise TestBedError(f"mariadb-install-db: {(cp.stdout + cp.stderr)[-1500:]}")
        sock = db / "mysqld.sock"
        self._spawn(h, "mariadbd", [MARIADBD, "--no-defaults", "--user=root", f"--datadir={db / 'data'}",
                                    f"--socket={sock}", "--bind-address=127.0.0.1", f"--port={DB_PORT}",
                                    f"--pid-file={db / 'mariadbd.pid'}", f"--log-error={db / 'mariadbd.log'}",
                                    "--innodb-buffer-pool-size=16M", "--skip-log-bin"])
        self._wait(lambda: sock.exists(), "mariadbd", db / "mariadbd.log")
        password = os.urandom(12).hex()
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        cp = subprocess.run([MARIADB, "--no-defaults", f"--socket={sock}", "-u", "root", "-e", sql],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
        if cp.returncode != 0:
            raise TestBedError(f"the accounting database's user: {cp.stderr.strip()}")
        conf = self.etc / "slurmdbd.conf"  # slurmdbd reads it beside slurm.conf (SLURM_CONF)
        d = self.dir
        conf.write_text("\n".join([
            f"# rigdeck test bed {self.bed.k}: Slurm's accounting (tests/slurmbed.py)",
            "AuthType=auth/munge", f"AuthInfo=socket={self.socket}",
            f"DbdHost={h.hostname}", f"DbdAddr={h.address}", "SlurmUser=root",
            f"PidFile={d / 'run' / 'slurmdbd.pid'}", f"LogFile={d / 'log' / 'slurmdbd.log'}", "DebugLevel=info",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={DB_PORT}",
            "StorageUser=slurm", f"StoragePass={password}", "StorageLoc=slurm_acct_db",
        ]) + "\n")
        conf.chmod(0o600)
        self._spawn(h, "slurmdbd", [SLURMDBD, "-D"])
        added: list[str] = []

        def cluster_added() -> bool:
            cp = subprocess.run(["nsenter", "--target", str(h.init_pid), "--net", "--uts", "--",
                                 "sacctmgr", "-i", "add", "cluster", self.cluster],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30, env=self._env())
            added[:] = [cp.stdout + cp.stderr]
            return cp.returncode == 0 or "already exists" in cp.stdout + cp.stderr
        self._wait(cluster_added, "sacctmgr add cluster", d / "log" / "slurmdbd.log", extra=lambda: " ".join(added))

    def _wait(self, cond: Any, what: str, log: Path, extra: Any = None) -> None:
        """Until ``cond()``, while the daemon started last runs; a TestBedError with its log if not."""
        deadline = time.monotonic() + self.start_timeout
        while not cond():
            if self._procs[-1].poll() is not None or time.monotonic() > deadline:
                raise TestBedError(f"{what} did not come up: {extra() if extra else ''} {self._tail(log)}")
            time.sleep(0.05)

    def _mount_etc(self) -> None:
        """The bed's Slurm configuration at /etc/slurm on every host (its own mount namespace)."""
        if not os.path.isdir(ETC_SLURM):  # a mount point only (Debian's packages make it)
            os.makedirs(ETC_SLURM, mode=0o755, exist_ok=True)
        for h in self.bed.hosts:
            cp = subprocess.run(["nsenter", "--target", str(h.init_pid), "--mount", "--",
                                 "mount", "--bind", str(self.etc), ETC_SLURM],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
            if cp.returncode != 0:
                raise TestBedError(f"mount of {ETC_SLURM} on {h.name}: {cp.stderr.strip()}")

    @staticmethod
    def _cgroup_mounts() -> list[tuple[str, str, str]]:
        """This machine's cgroup mounts under /sys/fs/cgroup, in mount order: (mount point,
        type, options), the tmpfs that holds v1 hierarchies first."""
        out: list[tuple[str, str, str]] = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                point = left.split()[4]
                fstype, _source, opts = (right.split() + ["", "", ""])[:3]
                if point == CGROUP_ROOT or point.startswith(CGROUP_ROOT + "/"):
                    if fstype in ("tmpfs", "cgroup", "cgroup2"):
                        keep = [o for o in opts.split(",") if o not in ("rw", "ro") and not o.startswith("size=")
                                and not o.startswith("nr_inodes=") and not o.startswith("inode")]
                        out.append((point, fstype, ",".join(keep)))
        return out

    def _mount_cgroups(self, h: TestHost) -> None:
        """This machine's cgroup mounts made again in host h's mount namespace (slurmd refuses
        to start without them, and refuses a mix of v1 and v2 it does not expect)."""
        for point, fstype, opts in self._cgroup_mounts():
            argv = ["mount", "-t", fstype] + (["-o", opts] if opts else []) + [fstype, point]
            cp = subprocess.run(["nsenter", "--target", str(h.init_pid), "--mount", "--", "sh", "-c",
                                 'mountpoint -q "$1" && exit 0; mkdir -p "$1" && shift && exec "$@"',
                                 "sh", point, *argv],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
            if cp.returncode != 0:
                raise TestBedError(f"mount of {point} ({fstype}) on {h.name}: {cp.stderr.strip()}")

    def _env(self) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(self.conf), "LANG": "C.UTF-8"}

    def _popen(self, argv: Sequence[str], logfile: Path) -> subprocess.Popen[bytes]:
        with open(logfile, "ab") as logf:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    start_new_session=True, close_fds=True, env=self._env(), cwd="/")
        self._procs.append(proc)
        return proc

    def _spawn(self, h: TestHost, name: str, argv: Sequence[str], whole: bool = False) -> None:
        """A daemon in host h's network and UTS namespaces (``whole``: its mount and PID ones
        too; else this machine's)."""
        if h.init_pid is None:
            raise TestBedError(f"host {h.name} is not running")
        spaces = ["--net", "--uts"] + (["--mount", "--pid"] if whole else [])
        self._popen(["nsenter", "--target", str(h.init_pid), *spaces, "--", *argv],
                    self.dir / "log" / f"{name}.out")

    @staticmethod
    def _tail(path: Path) -> str:
        try:
            return path.read_text(errors="replace")[-1500:].strip()
        except OSError:
            return ""

    # ---- using

    def run(self, argv: Sequence[str], host: int | str | TestHost = 1, *, user: str | None = None,
            timeout: float = 30.0, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        """A Slurm command on a bed host (as root, or as ``user``: ``nobody`` is the other user)."""
        argv = list(argv)
        if user is not None:
            group = OTHER_GROUP if user == OTHER_USER else user
            argv = ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", "--", *argv]
        cp = self.bed.exec(host, ["env", "-i", "PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LANG=C.UTF-8",
                                  *argv], timeout=timeout, **kw)
        if check and cp.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} on {self.bed.host(host).name} failed "
                                 f"({cp.returncode}): {cp.stderr.strip()} {cp.stdout.strip()}")
        return cp

    def node_states(self) -> dict[str, str]:
        """Node name -> its state as ``sinfo`` says it (``idle``, ``mix``, ``alloc``, ``drain``...)."""
        cp = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=15)
        out: dict[str, str] = {}
        for line in cp.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1]
        return out

    def jobs(self) -> list[str]:
        """Every job Slurm still runs or holds pending: ``id state user`` lines."""
        cp = self.run(["squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i %T %u"], timeout=15)
        return [line.strip() for line in cp.stdout.splitlines() if line.strip()]

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until every node is idle (no job, no drain), or TestBedError saying what each is."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise TestBedError(f"a Slurm daemon exited ({proc.args}): "
                                       f"{self._tail(self.dir / 'log' / 'slurmctld.log')}")
            states = self.node_states()
            if sorted(states) == sorted(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.1)
        raise TestBedError(f"Slurm's nodes are not all idle after {timeout}s: {states or 'no answer'}; "
                           f"{self._tail(self.dir / 'log' / 'slurmctld.log')}")

    def leftovers(self) -> list[str]:
        """What is not as a fresh Slurm has it: jobs, nodes not idle, drain reasons."""
        found = [f"Slurm job {j}" for j in self.jobs()]
        found += [f"node {n} is {s}" for n, s in sorted(self.node_states().items()) if s != "idle"]
        return found

    def settled(self, timeout: float = 10.0) -> list[str]:
        """``leftovers()`` once it is empty, or what is still there after ``timeout`` (a job a
        test cancelled at its end takes a moment to be gone)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.leftovers()
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def clean(self) -> None:
        """Cancel every job and resume every node that is not idle (what a test left)."""
        self.run(["scancel", "--full", "-u", "root"], check=False)
        self.run(["scancel", "--full", "-u", OTHER_USER], check=False)
        for n, s in self.node_states().items():
            if s.startswith(("drain", "drng", "down")):
                self.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], check=False)
        self.wait_idle(20.0)

    # ---- tearing down

    def down(self) -> None:
        """Stop every Slurm daemon and munged (and every job: each is in a host's network
        namespace) and remove the bed's Slurm files. Never raises."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._procs = []
        # slurmstepd and the jobs' processes are no child of ours: they live in the hosts'
        # network namespaces (the bed's teardown would take them too).
        for h in self.bed.hosts:
            if any(_is_slurm(p) for p in _netns_pids(h.netns)):
                _kill_slurm(h.netns)
            if h.init_pid is not None:
                subprocess.run(["nsenter", "--target", str(h.init_pid), "--mount", "--",
                                "umount", "-l", ETC_SLURM], capture_output=True, timeout=30,
                               stdin=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_slurm(pid: int) -> bool:
    """A Slurm daemon (slurmdbd's MariaDB too), slurmstepd, munged, or a process of a Slurm job
    (its environment says so)."""
    if _comm(pid).startswith(("slurm", "munged", "mariadbd")):
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return env.startswith(b"SLURM_JOB_ID=") or b"\0SLURM_JOB_ID=" in env


def processes(bed: TestBed) -> list[str]:
    """``host: comm (pid)`` of every Slurm daemon, slurmstepd, munged or Slurm job's process in
    the bed's hosts (found by network namespace: slurmd and its jobs are in the hosts' PID
    namespaces, slurmctld and munged in this machine's)."""
    return [f"{h.name}: {_comm(p)} ({p})" for h in bed.hosts for p in _netns_pids(h.netns) if _is_slurm(p)]


def _kill_slurm(netns: str) -> None:
    """Slurm's processes of one host (not its sshd): TERM, then KILL."""
    for sig in (15, 9):
        pids = [p for p in _netns_pids(netns) if _is_slurm(p)]
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_is_slurm(p) for p in _netns_pids(netns)):
            time.sleep(0.05)
