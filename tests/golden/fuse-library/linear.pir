// RUN: fuse-library,dce
// matmul by a weight [K, N] (a param), its bias and gelu: linear_pointwise{unary="gelu"}. A
// weight [N, K] read through transpose (as torch.nn.Linear is imported): weight_layout="nk",
// and the transpose goes. A product of two activations is no linear layer and stays.
graph @f(
    %x: f32[2,3,8],
    %w: f32[8,16] param,
    %b: f32[16] param,
    %wt: f32[4,16] param,
    %y: f32[16,5]
) -> (f32[2,3,4], f32[2,3,5]) {
  %0 = matmul(%x, %w) : f32[2,3,16]
  %1 = add(%b, %0) : f32[2,3,16]
  %2 = gelu(%1) {approximate="tanh"} : f32[2,3,16]
  %3 = transpose(%wt) {perm=[1, 0]} : f32[16,4]
  %4 = matmul(%2, %3) : f32[2,3,4]
  %5 = matmul(%2, %y) : f32[2,3,5]
  return %4, %5
}
// EXPECT:
graph @f(
    %x: f32[2,3,8],
    %w: f32[8,16] param,
    %b: f32[16] param,
    %wt: f32[4,16] param,
    %y: f32[16,5]
) -> (f32[2,3,4], f32[2,3,5]) {
  %0 = linear_pointwise(%x, %w, %b) {unary="gelu_tanh"} : f32[2,3,16]
  %1 = linear_pointwise(%0, %wt) {weight_layout="nk"} : f32[2,3,4]
  %2 = matmul(%0, %y) : f32[2,3,5]
  return %1, %2
}
