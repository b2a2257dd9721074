// The layer tests compiled by nvcc: the same cases, on Host and Cuda.
#include "test_layers.cpp"
