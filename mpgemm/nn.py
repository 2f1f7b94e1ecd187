"""Drop-in layers whose products run on mpgemm's kernels."""

import torch

from .ops import linear


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by :func:`mpgemm.linear`.

    Same constructor, parameters, initialisation and ``state_dict`` keys as
    ``torch.nn.Linear``, so checkpoints load into either. fp32 parameters stay
    fp32 (their own master copy) and are rounded to fp16 for each product; the
    output has the input's dtype.
    """

    def forward(self, input):
        return linear(input, self.weight, self.bias)

    def extra_repr(self):
        return super().extra_repr() + ", backend=mpgemm"
