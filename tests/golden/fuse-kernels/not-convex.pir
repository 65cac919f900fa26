// RUN: fuse-kernels,dce
// exp's result goes out to the matmul and comes back through it into the add: fusing exp
// with the add would make a cycle, so only add and tanh are fused. The f16 chain has no
// kernel dtype and stays.
graph @f(%x: f32[4,8], %w: f32[8,8] param, %h: f16[4,8]) -> (f32[4,8], f16[4,8]) {
  %0 = exp(%x) : f32[4,8]
  %1 = matmul(%0, %w) : f32[4,8]
  %2 = add(%0, %1) : f32[4,8]
  %3 = tanh(%2) : f32[4,8]
  %4 = add(%h, %h) : f16[4,8]
  %5 = tanh(%4) : f16[4,8]
  return %3, %5
}
// EXPECT:
graph @f(%x: f32[4,8], %w: f32[8,8] param, %h: f16[4,8]) -> (f32[4,8], f16[4,8]) {
  %0 = exp(%x) : f32[4,8]
  %1 = matmul(%0, %w) : f32[4,8]
  %2 = fused(%0, %1) {body="graph @kernel(%x0: f32[4,8], %x1: f32[4,8]) -> (f32[4,8]) {\n  %0 = add(%x0, %x1) : f32[4,8]\n  %1 = tanh(%0) : f32[4,8]\n  return %1\n}\n"} : f32[4,8]
  %3 = add(%h, %h) : f16[4,8]
  %4 = tanh(%3) : f16[4,8]
  return %2, %4
}
