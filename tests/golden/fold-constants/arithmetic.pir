// RUN: fold-constants
// Nodes whose operands are all constants are evaluated, transitively; a node reading a
// graph input is not. Constants left unused are erased.
graph @f(%x: f32[3]) -> (f32[3], f32[3]) {
  %a = constant() {value=dense<f32[3], [1.0, 2.0, 3.0]>} : f32[3]
  %b = constant() {value=dense<f32[3], [0.5, -1.0, 4.0]>} : f32[3]
  %c = add(%a, %b) : f32[3]
  %d = mul(%c, %c) : f32[3]
  %e = sub(%d, %x) : f32[3]
  %g = exp(%a) : f32[3]
  return %e, %g
}
// EXPECT:
graph @f(%x: f32[3]) -> (f32[3], f32[3]) {
  %0 = constant() {value=dense<f32[3], [2.25, 1.0, 49.0]>} : f32[3]
  %e = sub(%0, %x) : f32[3]
  %1 = constant() {value=dense<f32[3], [2.718282, 7.3890557, 20.085537]>} : f32[3]
  return %e, %1
}
