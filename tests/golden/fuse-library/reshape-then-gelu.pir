// RUN: fuse-library,dce
// BERT's intermediate layer as imported: the bias add, a reshape from [B*T, N] to [B, T, N],
// then GELU. The activation is elementwise, so it is taken into the linear before the
// reshape, which stays; a reshape before an op with no kernel (erf) stops the epilogue.
graph @f(
    %x: f32[6,8],
    %w: f32[8,12] param,
    %b: f32[12] param,
    %v: f32[8,12] param
) -> (f32[2,3,12], f32[2,3,12]) {
  %0 = matmul(%x, %w) : f32[6,12]
  %1 = add(%0, %b) : f32[6,12]
  %2 = reshape(%1) {shape=[2, 3, 12]} : f32[2,3,12]
  %3 = gelu(%2) : f32[2,3,12]
  %4 = matmul(%x, %v) : f32[6,12]
  %5 = reshape(%4) {shape=[2, 3, 12]} : f32[2,3,12]
  %6 = erf(%5) : f32[2,3,12]
  return %3, %6
}
// EXPECT:
graph @f(
    %x: f32[6,8],
    %w: f32[8,12] param,
    %b: f32[12] param,
    %v: f32[8,12] param
) -> (f32[2,3,12], f32[2,3,12]) {
  %0 = linear_pointwise(%x, %w, %b) {unary="gelu"} : f32[6,12]
  %1 = reshape(%0) {shape=[2, 3, 12]} : f32[2,3,12]
  %2 = linear_pointwise(%x, %v) : f32[6,12]
  %3 = reshape(%2) {shape=[2, 3, 12]} : f32[2,3,12]
  %4 = erf(%3) : f32[2,3,12]
  return %1, %4
}
