// RUN: fold-batch-norm
// The convolution's own bias folds in too: (b - running_mean) * s + beta, s = gamma / sqrt(var + eps).
graph @f(%x: f32[2,1,4,4]) -> (f32[2,2,3,3]) {
  %0 = constant() {value=dense<f32[2,1,2,2], [[[[1.0, -1.0], [0.5, 0.5]]], [[[0.0, 2.0], [-2.0, 1.0]]]]>} : f32[2,1,2,2]
  %1 = constant() {value=dense<f32[2], [0.5, -0.25]>} : f32[2]
  %2 = conv2d(%x, %0, %1) : f32[2,2,3,3]
  %3 = constant() {value=dense<f32[2], [2.0, 1.0]>} : f32[2]
  %4 = constant() {value=dense<f32[2], [0.0, 1.0]>} : f32[2]
  %5 = constant() {value=dense<f32[2], [0.5, 0.0]>} : f32[2]
  %6 = constant() {value=dense<f32[2], [1.0, 3.0]>} : f32[2]
  %7 = batch_norm(%2, %3, %4, %5, %6) {eps=0.0} : f32[2,2,3,3]
  return %7
}
// EXPECT:
graph @f(%x: f32[2,1,4,4]) -> (f32[2,2,3,3]) {
  %0 = constant() {value=dense<f32[2,1,2,2], [[[[2.0, -2.0], [1.0, 1.0]]], [[[0.0, 1.1547005], [-1.1547005, 0.57735026]]]]>} : f32[2,1,2,2]
  %1 = constant() {value=dense<f32[2], [0.0, 0.8556624]>} : f32[2]
  %2 = conv2d(%x, %0, %1) : f32[2,2,3,3]
  return %2
}
