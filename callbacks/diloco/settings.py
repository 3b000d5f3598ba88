"""DiLoCo settings (``conf/technique/diloco.yaml``), checked before anything runs.

Torch-free apart from checking the outer optimizer, which imports ``torch.optim``.
"""

import importlib.util
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlparse

from callbacks.technique import TechniqueSettings, refuse_pipeline
from common.data_groups import DataGroups
from common.errors import ConfigError
from settings.run_context import RunContext
from settings.typed import class_named

if TYPE_CHECKING:
    import torch

    from callbacks.diloco.callback import DiLoCo

BACKENDS = ("torch", "torchft")
#: How pseudo-gradients travel (``exchange.py``): fp32, bf16 values, or int8 with one scale per tensor.
COMPRESSIONS = ("none", "bf16", "int8")
TORCHFT_INSTALL = "pip install torchft==0.2.0"
#: Seconds to wait for the lighthouse's port, and for its answer, before calling it unreachable.
LIGHTHOUSE_CONNECT_S = 5.0
#: What a torchft lighthouse's dashboard (its answer to ``GET /``) says of itself.
LIGHTHOUSE_MARK = "torchft"


def on_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def facing_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (a UDP socket's source once connected;
    nothing is sent): the address a peer on that network reaches this machine at."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(address)
        return probe.getsockname()[0]


def http_answer(connection: socket.socket, host: str, path: str = "/") -> str:
    """The first bytes a connected server answers to an HTTP ``GET path`` ("" if it closes without
    a word; a TimeoutError at the connection's timeout if it says nothing)."""
    with connection:
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        answer = b""
        while len(answer) < 4096 and (chunk := connection.recv(4096)):
            answer += chunk
    return answer.decode("utf-8", "replace")


@dataclass(kw_only=True)
class TorchftSettings:
    """Args (``backend=torchft`` only):
    lighthouse: ``http://HOST:PORT`` of the torchft lighthouse (null: ``$TORCHFT_LIGHTHOUSE``).
    group: this job's replica group, in [0, replicas).
    timeout_s: a sync's collectives and a recovery transfer.
    quorum_timeout_s: waiting for a quorum (at a sync, or for a joining group, a round).
    host: the address other groups reach this group at, and the one its store listens on
        (null: 127.0.0.1 when the lighthouse is on loopback, so every group is on this
        machine; else this machine's address on the route to the lighthouse).
    min_groups: groups a round needs to commit (null: a majority of M, so that two quorums
        that do not share a group can never both commit a round).
    warn_after_rounds: a group that has committed none of this many rounds in a row says
        so, with its pace against its peers' (and again after as many more).
    per_group_keys: config keys, beyond the built-in per-group ones, that may differ
        between the groups (``launch/from_config.py``); they must not change training.
    """

    lighthouse: str | None
    group: int
    timeout_s: float
    quorum_timeout_s: float
    host: str | None
    min_groups: int | None
    warn_after_rounds: int
    per_group_keys: list[str]

    def address(self) -> str:
        return self.lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE", "")

    def reachable_host(self) -> str:
        """``host``, or where it is empty: 127.0.0.1 for a lighthouse on loopback, else this
        machine's address on the route to the lighthouse. Not the hostname's address, which
        many Linux machines map to 127.0.1.1, where no other host reaches it; a route that
        leads to a loopback address (the lighthouse named by a name this machine maps to
        itself) is refused, naming the setting."""
        if self.host:
            return self.host
        parsed = urlparse(self.address())
        lighthouse = parsed.hostname or ""
        if on_loopback(lighthouse):
            return "127.0.0.1"
        try:
            found = facing_address(lighthouse, parsed.port or 0)
        except OSError as error:
            raise ConfigError(
                f"technique.diloco.torchft.host is empty and no route to the lighthouse's host {lighthouse!r} was"
                f" found ({error.strerror or error}): set technique.diloco.torchft.host to the address other groups"
                " reach this machine at."
            ) from None
        if on_loopback(found):
            raise ConfigError(
                f"technique.diloco.torchft.host is empty and the lighthouse's host {lighthouse!r} is this machine's"
                f" loopback ({found}), which other hosts cannot reach: set technique.diloco.torchft.host to this"
                " machine's address on their network (or 127.0.0.1 if every group runs on this machine), or name the"
                " lighthouse by that address."
            )
        return found

    def quorum_size(self, replicas: int) -> int:
        return self.min_groups if self.min_groups is not None else replicas // 2 + 1


#: Outer learning rates by number of replicas (Charles et al. 2025); others use 0.7 (Douillard et al. 2023).
OUTER_LR_BY_REPLICAS = {1: 0.4, 2: 0.6, 4: 0.6, 8: 0.8}
STATE_DEVICES = ("same", "cpu")


@dataclass(kw_only=True)
class DiLoCoSettings(TechniqueSettings):
    """Args:
    replicas: M (1 is valid: a Lookahead-like outer step).
    sync_every: H, inner global steps between two syncs of a fragment.
    outer_lr: null picks it by M (0.4 / 0.6 / 0.6 / 0.8 for M = 1 / 2 / 4 / 8, else 0.7).
    outer_optimizer: any ``torch.optim`` optimizer: ``_target_`` (its class) and its
        arguments other than the learning rate (Nesterov SGD with momentum 0.9 by default).
    state_device: ``same`` (the parameters' device) or ``cpu`` for the anchor and outer state.
    compression: ``none``, ``bf16`` or ``int8`` for the pseudo-gradient exchange.
    simulated: null: simulate the replicas when M > 1 and the run has one process.
    fragments: P, the streaming fragments (groups of transformer blocks) that sync in turn.
    fragment_delay: tau, inner steps between the start of a fragment's exchange and its merge.
    fragment_alpha: the mixing factor of the merge (0: take the outer result).
    backend: ``torch`` (replicas simulated, or ranks of this job) or ``torchft`` (this job
        is one replica group of a fault-tolerant torchft quorum).
    torchft: the torchft backend's lighthouse, group and timeouts.
    """

    key: ClassVar[str] = "technique.diloco"

    replicas: int
    sync_every: int
    outer_lr: float | None
    outer_optimizer: dict[str, Any]
    state_device: str
    compression: str
    simulated: bool | None
    fragments: int
    fragment_delay: int
    fragment_alpha: float
    backend: str
    torchft: TorchftSettings

    def __post_init__(self) -> None:
        key = self.key
        if self.backend not in BACKENDS:
            raise ConfigError(f"{key}.backend={self.backend!r} is unknown; choose one of {BACKENDS}.")
        if self.replicas < 1 or self.sync_every < 1:
            raise ConfigError(f"{key}.replicas={self.replicas} and {key}.sync_every={self.sync_every} must be >= 1.")
        if self.state_device not in STATE_DEVICES:
            raise ConfigError(f"{key}.state_device={self.state_device!r} must be one of {STATE_DEVICES}.")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"{key}.compression={self.compression!r} is unknown; choose one of {COMPRESSIONS}.")
        if self.outer_lr is not None and self.outer_lr <= 0:
            raise ConfigError(f"{key}.outer_lr={self.outer_lr} must be > 0 (or null: by the number of replicas).")
        if self.fragments < 1 or self.sync_every % self.fragments:
            raise ConfigError(
                f"{key}.fragments={self.fragments} must be >= 1 and divide {key}.sync_every={self.sync_every},"
                " so the fragments sync at evenly spaced steps."
            )
        if not 0 <= self.fragment_delay < self.sync_every:
            raise ConfigError(
                f"{key}.fragment_delay={self.fragment_delay} must be in [0, sync_every={self.sync_every}):"
                " a fragment's exchange must be merged before that fragment syncs again."
            )
        if not 0 <= self.fragment_alpha < 1:
            raise ConfigError(f"{key}.fragment_alpha={self.fragment_alpha} must be in [0, 1).")

    @property
    def learning_rate(self) -> float:
        return self.outer_lr if self.outer_lr is not None else OUTER_LR_BY_REPLICAS.get(self.replicas, 0.7)

    @property
    def fault_tolerant(self) -> bool:
        return self.backend == "torchft"

    def data_groups(self) -> DataGroups:
        """With torchft each replica group is a job: the global batch and data split over them."""
        return DataGroups(self.replicas, self.torchft.group) if self.fault_tolerant else DataGroups()

    def is_simulated(self, world_size: int | None) -> bool:
        """Whether the replicas take turns in one process (unknown process counts count as one)."""
        if self.fault_tolerant:
            return False
        if self.simulated is not None:
            return self.simulated
        return self.replicas > 1 and (world_size or 1) == 1

    def sequential_replicas(self, run: RunContext) -> int:
        return self.replicas if self.is_simulated(run.world_size) else 1

    def outer_optimizer_class(self) -> "type[torch.optim.Optimizer]":
        import torch

        target = self.outer_optimizer.get("_target_", "")
        key = f"{self.key}.outer_optimizer._target_"
        return class_named(
            target, key, torch.optim.Optimizer, "a torch.optim optimizer class", "use e.g. torch.optim.SGD"
        )

    def make_outer_optimizer(self, parameters: "list[torch.Tensor]") -> "torch.optim.Optimizer":
        """The configured outer optimizer over the anchor tensors."""
        arguments = {key: value for key, value in self.outer_optimizer.items() if key != "_target_"}
        if "lr" in arguments:
            raise ConfigError(f"{self.key}.outer_optimizer.lr: set the outer learning rate with {self.key}.outer_lr.")
        try:
            return self.outer_optimizer_class()(parameters, lr=self.learning_rate, **arguments)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{self.key}.outer_optimizer: {error}") from error

    def check(self, run: RunContext) -> None:
        refuse_pipeline(self.key, run, "its replicas and outer step are not built for stages on several ranks yet")
        if self.fragments > run.n_layers:
            raise ConfigError(
                f"{self.key}.fragments={self.fragments} exceeds model.n_layers={run.n_layers}:"
                " fragments are groups of transformer blocks."
            )
        if self.fault_tolerant:
            self._check_torchft(run)
            return
        if run.world_size is None:
            return
        if self.is_simulated(run.world_size):
            self._check_simulated(run)
        else:
            self._check_real(run)

    def _check_simulated(self, run: RunContext) -> None:
        if run.world_size != 1:
            raise ConfigError(
                f"{self.key}.simulated=true runs all replicas in one process, but this run has {run.world_size};"
                f" set {self.key}.simulated=false for real replicas over the processes."
            )
        if run.strategy_name not in ("single_device", "ddp"):
            raise ConfigError(f"{self.key}: simulated replicas run unsharded; drop strategy={run.strategy_name}.")
        if run.max_steps > 0 and run.max_steps % self.replicas:
            raise ConfigError(
                f"trainer.max_steps={run.max_steps} counts optimizer steps, {self.replicas} per global step with"
                f" simulated replicas: make it a multiple of {self.key}.replicas."
            )

    def _check_real(self, run: RunContext) -> None:
        ranks = run.world_size // run.tensor_parallel_size  # each replica holds whole tensor-parallel groups
        if ranks % self.replicas:
            split = f" ({run.world_size} processes / strategy.tensor_parallel_size={run.tensor_parallel_size})"
            raise ConfigError(
                f"{self.key}.replicas={self.replicas} must divide the {ranks} data-parallel ranks"
                f"{split if run.tensor_parallel_size > 1 else ''}: raise trainer.devices or lower the replicas."
            )
        if self.replicas > 1 and run.strategy_name != "fsdp2":
            raise ConfigError(
                f"{self.key}.replicas={self.replicas} over processes needs strategy=fsdp2: DDP or FSDP1 would"
                " average gradients across replicas at every step."
            )
        if run.world_size > 1 and run.save_distributed_checkpoint:
            raise ConfigError(
                "DiLoCo checkpoints gather every replica's state into one file:"
                " set strategy.save_distributed_checkpoint=false."
            )

    def _check_torchft(self, run: RunContext) -> None:
        """The package, the lighthouse's address, one process per group, and the classic
        algorithm (no streaming fragments, no compression)."""
        key = f"{self.key}.torchft"
        if importlib.util.find_spec("torchft") is None:
            raise ConfigError(f"{self.key}.backend=torchft needs the torchft package: {TORCHFT_INSTALL}")
        if not 0 <= self.torchft.group < self.replicas:
            raise ConfigError(f"{key}.group={self.torchft.group} must be in [0, replicas={self.replicas}).")
        if self.torchft.warn_after_rounds < 1:
            raise ConfigError(f"{key}.warn_after_rounds={self.torchft.warn_after_rounds} must be >= 1.")
        if self.torchft.min_groups is not None and not 1 <= self.torchft.min_groups <= self.replicas:
            raise ConfigError(
                f"{key}.min_groups={self.torchft.min_groups} must be in [1, replicas={self.replicas}]"
                " (null: a majority of the groups)."
            )
        if run.world_size not in (None, 1):
            raise ConfigError(
                f"{self.key}.backend=torchft runs one process per replica group; this run has {run.world_size}."
            )
        if self.fragments != 1 or self.fragment_delay or self.compression != "none" or self.simulated:
            raise ConfigError(
                f"{self.key}.backend=torchft runs classic DiLoCo: set fragments=1, fragment_delay=0,"
                " compression=none and simulated=null."
            )
        self._lighthouse()

    def _lighthouse(self) -> tuple[str, str, int]:
        """The lighthouse's address, host and port: ``http://HOST:PORT`` with a port in
        1-65535 (torchft's client needs the scheme; anything else is a ConfigError)."""
        address = self.torchft.address()
        parsed = urlparse(address)
        try:
            port = parsed.port
        except ValueError:  # out of range, or not a number
            port = None
        if parsed.scheme not in ("http", "https") or not parsed.hostname or not port or parsed.path not in ("", "/"):
            raise ConfigError(
                f"{self.key}.torchft.lighthouse={address!r} must be http://HOST:PORT of the lighthouse, the port in 1-65535"
                " (or set $TORCHFT_LIGHTHOUSE), e.g. http://127.0.0.1:29510."
            )
        return address, parsed.hostname, port

    def check_services(self, run: RunContext) -> None:
        """The lighthouse answers on its port within ``LIGHTHOUSE_CONNECT_S``, as a torchft
        lighthouse (its dashboard, on ``GET /``), and this group has an address the others reach.
        First the outer optimizer is built on a stand-in tensor (its class and arguments): here, as
        the run starts, since that needs torch, which the settings' own checks never load."""
        import torch

        self.make_outer_optimizer([torch.zeros(1)])
        if not self.fault_tolerant:
            return
        address, host, port = self._lighthouse()
        start = f"torchft_lighthouse --min_replicas {self.torchft.quorum_size(self.replicas)} --bind HOST:PORT"
        try:
            connection = socket.create_connection((host, port), timeout=LIGHTHOUSE_CONNECT_S)
        except OSError as error:
            raise ConfigError(
                f"{self.key}.torchft.lighthouse={address} cannot be reached ({error.strerror or error}); start it first: {start}"
            ) from None
        try:
            answer = http_answer(connection, host)
        except OSError:
            answer = f"no answer within {LIGHTHOUSE_CONNECT_S:g} s"
        if LIGHTHOUSE_MARK not in answer:
            said = " ".join(answer.split()[:8]) or "nothing"
            raise ConfigError(
                f"{self.key}.torchft.lighthouse={address} answers, but not as a torchft lighthouse ({said!r}): point it"
                f" at the lighthouse's --bind address, or start one there: {start}"
            )
        self.torchft.reachable_host()

    def build(self, run: RunContext) -> "DiLoCo":
        from callbacks.diloco.callback import DiLoCo

        return DiLoCo(
            self, simulated=self.is_simulated(run.world_size), n_layers=run.n_layers, shared=run.shared_settings
        )
