// RUN: fold-batch-norm
// A 1x1 convolution whose weight is a constant, then batch_norm with constant statistics:
// one convolution with the folded weight and a new bias (computed in f64, stored in f32).
graph @f(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
  %0 = constant() {value=dense<f32[2,2,1,1], [[[[0.5]], [[-1.0]]], [[[2.0]], [[0.25]]]]>} : f32[2,2,1,1]
  %1 = conv2d(%x, %0) : f32[1,2,3,3]
  %2 = constant() {value=dense<f32[2], [1.5, 0.5]>} : f32[2]
  %3 = constant() {value=dense<f32[2], [0.25, -0.5]>} : f32[2]
  %4 = constant() {value=dense<f32[2], [0.125, 1.0]>} : f32[2]
  %5 = constant() {value=dense<f32[2], [4.0, 0.25]>} : f32[2]
  %6 = batch_norm(%1, %2, %3, %4, %5) {eps=0.0} : f32[1,2,3,3]
  %7 = relu(%6) : f32[1,2,3,3]
  return %7
}
// EXPECT:
graph @f(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
  %0 = constant() {value=dense<f32[2,2,1,1], [[[[0.375]], [[-0.75]]], [[[2.0]], [[0.25]]]]>} : f32[2,2,1,1]
  %1 = constant() {value=dense<f32[2], [0.15625, -1.5]>} : f32[2]
  %2 = conv2d(%x, %0, %1) : f32[1,2,3,3]
  %3 = relu(%2) : f32[1,2,3,3]
  return %3
}
