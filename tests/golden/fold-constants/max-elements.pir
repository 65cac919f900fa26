// RUN: fold-constants{max-elements=4}
// Results (and operands) above max-elements are not materialized: the 8-element matmul
// stays, the 4-element one folds. Splat results fold whatever their size.
graph @f() -> (f32[2,2], f32[2,4], f32[2,4]) {
  %a = constant() {value=dense<f32[2,2], [[1.0, 2.0], [3.0, 4.0]]>} : f32[2,2]
  %b = constant() {value=dense<f32[2,4], [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]>} : f32[2,4]
  %c = matmul(%a, %a) : f32[2,2]
  %d = matmul(%a, %b) : f32[2,4]
  %e = full() {shape=[2, 4], value=3.0} : f32[2,4]
  %f = neg(%e) : f32[2,4]
  return %c, %d, %f
}
// EXPECT:
graph @f() -> (f32[2,2], f32[2,4], f32[2,4]) {
  %a = constant() {value=dense<f32[2,2], [[1.0, 2.0], [3.0, 4.0]]>} : f32[2,2]
  %b = constant() {value=dense<f32[2,4], [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]>} : f32[2,4]
  %0 = constant() {value=dense<f32[2,2], [[7.0, 10.0], [15.0, 22.0]]>} : f32[2,2]
  %d = matmul(%a, %b) : f32[2,4]
  %1 = full() {shape=[2, 4], value=-3.0} : f32[2,4]
  return %0, %d, %1
}
