// The Vision Transformer layer tests compiled by nvcc: the same cases, on Host and Cuda (the
// Model training case stays in the host binary).
#include "test_vit.cpp"
