"""The model as a pure function of (params, buffers, inputs), via ``torch.func.functional_call``."""

from __future__ import annotations

import contextlib
import copy
import threading

import torch
from torch.func import functional_call

from ..models import SplitNet
from ..models.dropout import has_dropout
from .masking import model_pads_ok, pad_aware


def sub_state(d: dict, prefix: str) -> dict:
    """The entries of a params/buffers dict under ``prefix`` (``"body."``), named as the child module names them."""
    n = len(prefix)
    return {k[n:]: v for k, v in d.items() if k.startswith(prefix)}


class FModel:
    """Stateless calls into a :class:`SplitNet`; ``params``/``buffers`` use the net's own names."""

    def __init__(self, net: SplitNet):
        self._net = net
        self._local = threading.local()  # a worker thread's own copy of the module (functional_call swaps
        self._copies: list[SplitNet] = []  # parameters into the module it is given, so threads must not share one)
        self.param_names = [n for n, _ in net.named_parameters()]
        self.buffer_names = [n for n, _ in net.named_buffers()]
        # BatchNorm without running statistics normalises eval batches by their own statistics (CAFeMe's
        # networks): then the samples of one forward pass interact and evaluation must not pad batches
        self.eval_uses_batch_stats = any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not m.track_running_stats for m in net.modules()
        )
        self.has_dropout = has_dropout(net)  # KeyedDropout layers: the executors key their masks per client-step
        self.pads_ok = model_pads_ok(net)  # padded batches cannot leak into real samples (engine/masking.py)
        self._one_sample_fails: dict = {}  # input shape -> batch_of_one_fails

    @property
    def net(self) -> SplitNet:
        return getattr(self._local, "net", None) or self._net

    @contextlib.contextmanager
    def worker(self, i: int):
        """In this thread, calls go to module copy ``i`` (for clients trained in parallel threads)."""
        while len(self._copies) <= i:
            self._copies.append(copy.deepcopy(self._net))
        self._local.net = self._copies[i]
        self._copies[i].train(self._net.training)
        try:
            yield self
        finally:
            self._local.net = None

    def __call__(self, params, buffers, x):
        """Logits."""
        return functional_call(self.net, (params, buffers), (x,))

    def features(self, params, buffers, x):
        """Body output (the feature h fed to the head)."""
        return functional_call(self.net.body, (sub_state(params, "body."), sub_state(buffers, "body.")), (x,))

    def head(self, params, buffers, h):
        """Head applied to features ``h``."""
        return functional_call(self.net.head, (sub_state(params, "head."), sub_state(buffers, "head.")), (h,))

    def init_state(self, dtype=torch.float32, device="cpu"):
        """Copies of the net's initial parameters and buffers (as one client's model)."""
        p = {k: v.detach().clone().to(device=device, dtype=dtype) for k, v in self.net.named_parameters()}
        b = {
            k: (
                v.detach().clone().to(device=device, dtype=dtype)
                if v.is_floating_point()
                else v.detach().clone().to(device)
            )
            for k, v in self.net.named_buffers()
        }
        return p, b

    def batch_of_one_fails(self, x: torch.Tensor) -> bool:
        """Whether a training batch of ONE sample shaped like ``x[0]`` cannot be normalised: a BatchNorm layer of torch
        in training mode would see one value per channel (``F.batch_norm`` raises "Expected more than 1 value per
        channel"; the padded batches' masked one would give a 0 variance). BatchNorm1d heads, and BatchNorm2d on
        1x1 maps (ResNet-50's last stage on 32x32 inputs); not BatchNorm2d on larger maps. Probed once per input
        shape: the shapes BatchNorm layers see in one eval-mode forward (of 2 samples: a BatchNorm without running
        statistics normalises eval batches too)."""
        key = tuple(x.shape[1:])
        if key not in self._one_sample_fails:
            net, per_channel = self._net, []
            bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            hooks = [m.register_forward_pre_hook(lambda m, a: per_channel.append(a[0][0, 0].numel())) for m in bns]
            training = net.training
            try:
                with torch.no_grad():
                    net.eval()(x[:2])
            finally:
                for h in hooks:
                    h.remove()
                net.train(training)
            self._one_sample_fails[key] = 1 in per_channel
        return self._one_sample_fails[key]

    def names(self, scope: str) -> list[str]:
        return self.net.names(scope)

    def set_mode(self, train: bool) -> None:
        self.net.train(train)


@pad_aware
def cross_entropy(fm: FModel, p, b, x, y, ctx):
    """The default local objective: CE of the model's logits."""
    return torch.nn.functional.cross_entropy(fm(p, b, x), y)
