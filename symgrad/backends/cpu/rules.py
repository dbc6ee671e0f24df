"""Scalar backward rules shared by the size-1 path (plain Python) and the Numba loops.

Each is the op's tensor-op formula (symgrad/ops/elementwise.py) on one element; no
Numba here, so tiny graphs never import it.
"""

from __future__ import annotations

import math


def exp_b(g, r):
    return g * r


def log_b(g, x):
    return g / x


def sin_b(g, x):
    return g * math.cos(x)


def cos_b(g, x):
    return g * -math.sin(x)


def tanh_b(g, r):
    return g * (1 - r * r)


def sigmoid_b(g, r):
    return g * (r * (1 - r))


def sqrt_b(g, r):
    return g / (2 * r)


def relu_b(g, r):
    return g * (1 if r > 0 else 0)


def abs_b(g, x):
    return g * (1.0 if x > 0 else (-1.0 if x < 0 else x - x))  # g * sign(x)


def reciprocal_b(g, r):
    return -g * r * r


def relu(v):
    return v if not v <= 0 else 0.0  # nan stays nan, as in torch


#: op name -> scalar rule
SCALAR_BACKWARD = {"exp": exp_b, "log": log_b, "sin": sin_b, "cos": cos_b, "tanh": tanh_b,
                   "sigmoid": sigmoid_b, "sqrt": sqrt_b, "relu": relu_b, "abs": abs_b,
                   "reciprocal": reciprocal_b}
