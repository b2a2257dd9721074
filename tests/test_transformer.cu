// The transformer layer tests compiled by nvcc: the same cases, on Host and Cuda (the Model
// training cases stay in the host binary).
#include "test_transformer.cpp"
