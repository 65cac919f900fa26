// RUN: fuse-kernels,dce
// A clamp-scale-shift chain with scalar constants is one kernel; the constants are copied
// into its body as immediates and vanish from the graph.
graph @f(%x: f32[4,9]) -> (f32[4,9]) {
  %lo = full() {shape=[], value=-2.0} : f32[]
  %hi = full() {shape=[], value=2.0} : f32[]
  %0 = maximum(%x, %lo) : f32[4,9]
  %1 = minimum(%0, %hi) : f32[4,9]
  %s = full() {shape=[], value=1.01} : f32[]
  %2 = mul(%1, %s) : f32[4,9]
  %b = full() {shape=[], value=0.1} : f32[]
  %3 = add(%2, %b) : f32[4,9]
  return %3
}
// EXPECT:
graph @f(%x: f32[4,9]) -> (f32[4,9]) {
  %0 = fused(%x) {body="graph @kernel(%x0: f32[4,9]) -> (f32[4,9]) {\n  %0 = full() {shape=[], value=-2.0} : f32[]\n  %1 = full() {shape=[], value=2.0} : f32[]\n  %2 = maximum(%x0, %0) : f32[4,9]\n  %3 = minimum(%2, %1) : f32[4,9]\n  %4 = full() {shape=[], value=1.01} : f32[]\n  %5 = mul(%3, %4) : f32[4,9]\n  %6 = full() {shape=[], value=0.1} : f32[]\n  %7 = add(%5, %6) : f32[4,9]\n  return %7\n}\n"} : f32[4,9]
  return %0
}
