"""Drop-in layers whose products run on mpgemm's kernels, and the forward
that :func:`mpgemm.convert` gives transformers' ``Conv1D``."""

import threading

import torch

import torch.nn.functional as F

from .ops import conv2d, conv2d_batch_stats, linear

# The Conv2d forwards whose batch statistics a fused chain asks for
# (mpgemm.fusion.conv_chains.run_chain): {(thread, id(module)): []}, which the
# module's next forward takes out and answers with [(y, statistics, y's
# version)]. A global dict, empty but inside a chain's call, so that the
# check costs a forward one truth test and torch.compile guards on it.
batch_stats_requests = {}


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by :func:`mpgemm.linear`.

    Same constructor, parameters, initialisation and ``state_dict`` keys as
    ``torch.nn.Linear``, so checkpoints load into either. Parameters may be
    fp32, fp16 or bf16; fp32 ones stay fp32 (their own master copy) and are
    rounded to the product's 16-bit type (:func:`mpgemm.linear`) for each
    product; the output has the input's dtype.
    """

    def forward(self, input):
        return linear(input, self.weight, self.bias)

    def extra_repr(self):
        return super().extra_repr() + ", backend=mpgemm"


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by :func:`mpgemm.conv2d`.

    Same constructor, parameters, initialisation and ``state_dict`` keys as
    ``torch.nn.Conv2d``. Every ``padding_mode`` works: "zeros" is the kernels'
    own padding; "reflect", "replicate" and "circular" pad the input first with
    ``torch.nn.functional.pad``, as torch does.
    """

    def forward(self, input):
        if batch_stats_requests:
            answer = batch_stats_requests.pop((threading.get_ident(), id(self)), None)
            if answer is not None and self.padding_mode == "zeros" and input.dim() == 4:
                y, stats = conv2d_batch_stats(input, self.weight, self.bias, self.stride, self.padding,
                                              self.dilation, self.groups)
                answer.append((y, stats, y._version))
                return y
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return super().extra_repr() + ", backend=mpgemm"


class Conv1D(torch.nn.Module):
    """The forward of transformers' ``Conv1D`` on :func:`mpgemm.linear`.

    GPT-2's matrix layers hold a weight of shape (in_features, out_features)
    and compute ``x @ weight + bias``; the weight is read in place as the
    transposed operand of a linear layer. :func:`mpgemm.convert` puts this
    class before transformers' in a converted layer's class (mpgemm does not
    import transformers).
    """

    def forward(self, input):
        return linear(input, self.weight.t(), self.bias)
