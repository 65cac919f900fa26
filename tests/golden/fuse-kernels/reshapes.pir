// RUN: fuse-kernels,dce
// GPT-2's MLP: the bias add, the reshape back to [batch, seq, hidden] and the GELU are one
// kernel; reshapes between members are free (the kernel walks one flat index).
graph @f(%x: f32[6,8], %w: f32[8,12] param, %b: f32[12] param) -> (f32[2,3,12]) {
  %0 = matmul(%x, %w) : f32[6,12]
  %1 = add(%0, %b) : f32[6,12]
  %2 = reshape(%1) {shape=[2, 3, 12]} : f32[2,3,12]
  %3 = gelu(%2) {approximate="tanh"} : f32[2,3,12]
  return %3
}
// EXPECT:
graph @f(%x: f32[6,8], %w: f32[8,12] param, %b: f32[12] param) -> (f32[2,3,12]) {
  %0 = matmul(%x, %w) : f32[6,12]
  %1 = fused(%0, %b) {body="graph @kernel(%x0: f32[6,12], %x1: f32[12]) -> (f32[2,3,12]) {\n  %0 = add(%x0, %x1) : f32[6,12]\n  %1 = reshape(%0) {shape=[2, 3, 12]} : f32[2,3,12]\n  %2 = gelu(%1) {approximate=\"tanh\"} : f32[2,3,12]\n  return %2\n}\n"} : f32[2,3,12]
  return %1
}
