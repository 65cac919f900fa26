// RUN: fuse-activations,dce
// The tanh GELU with the outer product grouped x * (0.5 * (1 + t)) and the cube written
// x * x * x; the operands of add and mul in the other order.
graph @f(%x: f32[3,4]) -> (f32[3,4]) {
  %a = mul(%x, %x) : f32[3,4]
  %b = mul(%a, %x) : f32[3,4]
  %c = full() {shape=[], value=0.044715} : f32[]
  %d = mul(%c, %b) : f32[3,4]
  %e = add(%d, %x) : f32[3,4]
  %s = full() {shape=[], value=0.7978845608} : f32[]
  %f = mul(%s, %e) : f32[3,4]
  %t = tanh(%f) : f32[3,4]
  %one = full() {shape=[], value=1.0} : f32[]
  %u = add(%one, %t) : f32[3,4]
  %h = full() {shape=[], value=0.5} : f32[]
  %v = mul(%h, %u) : f32[3,4]
  %w = mul(%x, %v) : f32[3,4]
  return %w
}
// EXPECT:
graph @f(%x: f32[3,4]) -> (f32[3,4]) {
  %0 = gelu(%x) {approximate="tanh"} : f32[3,4]
  return %0
}
