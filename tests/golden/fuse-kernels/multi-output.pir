// RUN: fuse-kernels,dce
// An intermediate that a later matmul also reads becomes a second output of the kernel; a
// lone exp stays an ATen op (fusing one op saves no memory traffic).
graph @f(%x: f32[4,8], %w: f32[8,8] param) -> (f32[4,8], f32[4,8], f32[4,8]) {
  %0 = mul(%x, %x) : f32[4,8]
  %1 = add(%0, %x) : f32[4,8]
  %2 = tanh(%1) : f32[4,8]
  %3 = matmul(%1, %w) : f32[4,8]
  %4 = exp(%3) : f32[4,8]
  return %2, %3, %4
}
// EXPECT:
graph @f(%x: f32[4,8], %w: f32[8,8] param) -> (f32[4,8], f32[4,8], f32[4,8]) {
  %0, %1 = fused(%x) {body="graph @kernel(%x0: f32[4,8]) -> (f32[4,8], f32[4,8]) {\n  %0 = mul(%x0, %x0) : f32[4,8]\n  %1 = add(%0, %x0) : f32[4,8]\n  %2 = tanh(%1) : f32[4,8]\n  return %1, %2\n}\n"} : f32[4,8], f32[4,8]
  %2 = matmul(%0, %w) : f32[4,8]
  %3 = exp(%2) : f32[4,8]
  return %1, %2, %3
}
