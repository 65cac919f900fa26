// RUN: fold-batch-norm
// Left alone: a convolution whose result is also read elsewhere (it must stay unnormalized),
// a batch_norm in training mode (batch statistics), and one whose input is no convolution.
graph @f(
    %x: f32[2,1,3,3]
) -> (f32[2,1,3,3], f32[2,1,3,3], f32[2,1,3,3], f32[1], f32[1], f32[2,1,3,3]) {
  %0 = constant() {value=dense<f32[1,1,1,1], [[[[2.0]]]]>} : f32[1,1,1,1]
  %1 = constant() {value=dense<f32[1], [1.0]>} : f32[1]
  %2 = constant() {value=dense<f32[1], [0.0]>} : f32[1]
  %3 = conv2d(%x, %0) : f32[2,1,3,3]
  %4 = batch_norm(%3, %1, %2, %2, %1) : f32[2,1,3,3]
  %5 = conv2d(%x, %0) : f32[2,1,3,3]
  %6, %7, %8 = batch_norm(%5, %1, %2, %2, %1) {training=true} : f32[2,1,3,3], f32[1], f32[1]
  %9 = batch_norm(%x, %1, %2, %2, %1) : f32[2,1,3,3]
  return %3, %4, %6, %7, %8, %9
}
// EXPECT:
graph @f(
    %x: f32[2,1,3,3]
) -> (f32[2,1,3,3], f32[2,1,3,3], f32[2,1,3,3], f32[1], f32[1], f32[2,1,3,3]) {
  %0 = constant() {value=dense<f32[1,1,1,1], [[[[2.0]]]]>} : f32[1,1,1,1]
  %1 = constant() {value=dense<f32[1], [1.0]>} : f32[1]
  %2 = constant() {value=dense<f32[1], [0.0]>} : f32[1]
  %3 = conv2d(%x, %0) : f32[2,1,3,3]
  %4 = batch_norm(%3, %1, %2, %2, %1) : f32[2,1,3,3]
  %5 = conv2d(%x, %0) : f32[2,1,3,3]
  %6, %7, %8 = batch_norm(%5, %1, %2, %2, %1) {training=true} : f32[2,1,3,3], f32[1], f32[1]
  %9 = batch_norm(%x, %1, %2, %2, %1) : f32[2,1,3,3]
  return %3, %4, %6, %7, %8, %9
}
