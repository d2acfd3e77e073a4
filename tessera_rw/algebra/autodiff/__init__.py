"""Reverse-mode differentiation of op graphs.

Each op declares its VJP next to its shape rule (`OpDef.vjp`), written with the symbolic-tensor
API and the cotangent algebra of `autodiff.cotangents`; `autodiff.reverse.grad_graph` walks a
traced graph backwards and builds the Graph of the requested gradients from those rules.

Nothing is imported here: the op modules import `cotangents` while the op registry is still
being built, and `reverse` needs that registry.
"""
