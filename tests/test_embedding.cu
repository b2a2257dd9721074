// The Embedding tests compiled by nvcc: the cases templated on the place run on Host and Cuda
// (the Model training cases stay in the host binary).
#include "test_embedding.cpp"
