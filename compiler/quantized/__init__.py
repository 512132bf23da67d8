"""Quantised (int8) networks for the VTA-like accelerator, in integer numpy.

`int8_ops`: the integer pieces (im2col, GEMM + shift-and-clip requantisation, residual adds,
pooling) that define the arithmetic bit for bit. `resnet`: a quantised ResNet-18 built from seeded
weights and calibrated on a seeded image, and its forward pass over a pluggable conv. `accel`: how
its convolutions become accelerator programs (im2col + `vta_dense` today).
"""
