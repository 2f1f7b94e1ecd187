"""A fused chain's output recomputed in backward instead of kept.

A conv -> batch norm (-> ReLU) chain without a residual add (the first two
of a ResNet bottleneck's three) whose output goes to the next chain's
convolution alone (past Identity modules), or to a max pool alone (a
ResNet's stem): that call saves the output for its backward, while the
chain's own backward already keeps y (its batch norm's input), the
per-channel scale and shift, and the ReLU's bits (16-bit y, 8 | C). The
output is y's image under the forward's elementwise pass, so the call saves
a :class:`Recipe` in its place (autograd's saved-tensor hooks, around that
call only) and its backward recomputes the output from y with
``torch.ops.mpgemm.batch_norm_apply``, bit for bit.
Each such chain keeps one activation fewer for one elementwise pass more in
backward (bench/NOTES.md has the figures). Where the chain's backward keeps
its output anyway (a ReLU's mask without bits: fp32, or C not a multiple of
8), nothing is recomputed. ``MPGEMM_RECOMPUTE_CHAIN_OUTPUTS=0`` when fuse()
runs keeps the outputs.

Only that output, unchanged since its chain made it, is replaced (a
consumer's pre-hook that changes it in place, or one that hands the
convolution another tensor, leaves what is saved as it was; a write through
``.data`` or a NumPy view, which no version counter sees, would make the
output made again differ from the one the call used). Saved-tensor
hooks already active (an outer ``saved_tensors_hooks``, a non-reentrant
checkpoint, an offload to the CPU) get every other tensor the call saves and
the recipe's y, scale and shift in the output's place; where such hooks are
disabled, or under torch.compile, the output is kept as before.
"""

import contextlib
import os
import weakref

import torch

_INPLACE = ("one of the variables needed for gradient computation has been modified by an inplace operation: "
            "{what} (mpgemm.fuse recomputes a chain's output from it in backward)")
_CHANGED = ("one of the variables needed for gradient computation has been modified by an inplace operation: "
            "[{type} {shape}] is at version {now}; expected version {saved} instead (saved by a call whose saved "
            "tensors mpgemm.fuse's recomputation watches)")


def recompute_enabled():
    """Whether fused chains recompute their outputs in backward
    (MPGEMM_RECOMPUTE_CHAIN_OUTPUTS: "1" or unset) or keep them ("0")."""
    value = os.environ.get("MPGEMM_RECOMPUTE_CHAIN_OUTPUTS", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"MPGEMM_RECOMPUTE_CHAIN_OUTPUTS must be '0' or '1', got {value!r}")
    return value != "0"


def make_output(y, scale, shift, relu):
    """The forward's elementwise pass again: relu?(y * scale + shift), its bits."""
    return torch.ops.mpgemm.batch_norm_apply(y, scale, shift, relu)


class Recipe:
    """How a chain's output is made again (make_output, from tensors the
    chain's backward keeps), and that output itself, weakly, with its
    version: only it, unchanged, is replaced."""

    __slots__ = ("y", "scale", "shift", "relu", "y_version", "output", "output_version", "__weakref__")

    def __init__(self, y, scale, shift, relu, output):
        self.y, self.scale, self.shift, self.relu, self.y_version = y, scale, shift, relu, y._version
        self.output, self.output_version = weakref.ref(output), output._version

    def made(self, t):
        return t is self.output() and t._version == self.output_version


class _Packed:
    """What autograd keeps in place of the output: the recipe's tensors (as
    the hooks outside packed them, if any) and the output, weakly."""

    __slots__ = ("tensors", "relu", "y_version", "output", "output_version")

    def __init__(self, recipe, outer_pack):
        tensors = (recipe.y, recipe.scale, recipe.shift)
        self.tensors = tensors if outer_pack is None else tuple(outer_pack(t) for t in tensors)
        self.relu, self.y_version = recipe.relu, recipe.y_version
        self.output, self.output_version = recipe.output, recipe.output_version

    def unpack(self, outer_unpack):
        output = self.output()
        if output is not None:  # still alive elsewhere: nothing to make
            if output._version != self.output_version:
                raise RuntimeError(_INPLACE.format(what="the chain's output"))
            return output
        if torch.is_grad_enabled():
            raise RuntimeError("mpgemm.fuse: a chain's output recomputed in backward cannot be differentiated "
                               "twice (create_graph=True); set MPGEMM_RECOMPUTE_CHAIN_OUTPUTS=0 to keep it")
        if outer_unpack is None:
            y, scale, shift = self.tensors
            if y._version != self.y_version:
                raise RuntimeError(_INPLACE.format(what="the batch norm's input"))
        else:  # the hooks outside answer for what they kept
            y, scale, shift = (outer_unpack(t) for t in self.tensors)
        return make_output(y, scale, shift, self.relu)


class _Kept:
    """Another tensor the call saves, with its version: torch checks none of
    those a hook packed, so unpack does (hooks outside answer for theirs)."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor, self.version = tensor, tensor._version

    def unpack(self):
        t = self.tensor
        if t._version != self.version:
            raise RuntimeError(_CHANGED.format(type=t.type(), shape=list(t.shape), now=t._version,
                                               saved=self.version))
        return t


def _hooks_usable():
    return not torch.compiler.is_compiling() and torch._C._autograd._saved_tensors_hooks_is_enabled()


@contextlib.contextmanager
def saved_as_recipe(recipe):
    """Inside, autograd saves `recipe` where it would save the output it
    makes, and hands every other tensor to the hooks outside, if any."""
    if recipe is None or not torch.is_grad_enabled() or not _hooks_usable():
        yield
        return
    outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
    outer_pack, outer_unpack = outer if outer is not None else (None, None)
    # Autograd keeps both hooks with each tensor they saved: the pack hook
    # holds the recipe weakly, so that only a _Packed keeps its tensors.
    recipe = weakref.ref(recipe)

    def pack(t):
        live = recipe()
        if live is not None and live.made(t):
            return _Packed(live, outer_pack)
        return _Kept(t) if outer_pack is None else outer_pack(t)

    def unpack(packed):
        if type(packed) is _Packed:
            return packed.unpack(outer_unpack)
        return packed.unpack() if outer_unpack is None else outer_unpack(packed)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
